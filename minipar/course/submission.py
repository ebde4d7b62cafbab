"""A submission taken in: its exercise files found (nested uploads flattened), checked against
each exercise's policy (course/policy.py), and copied to a folder the student's processes read.

    found = submission.files(Path("upload"))          # {"ex03_ring_allreduce": Path(...), ...}
    refused = submission.admit(found, scratch, solutions)   # {"ex03_...": ["...py:12: ..."]}

A file the policy refuses is not copied: in its place stands a module that raises ImportError
with the refusals (file and line), so every test of that exercise fails saying why, and the
other exercises are graded as if it were not there. A syntax error is refused the same way.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from minipar.course import policy

EXERCISE_FILE = re.compile(r"^ex\d\d_\w+\.py$")


def files(folder: Path, known: set[str] | None = None) -> dict[str, Path]:
    """exercise -> its file in `folder`, looking into sub-folders as Gradescope's flattening
    would (the shallowest copy wins; hidden folders and __MACOSX are skipped)."""
    found: dict[str, Path] = {}
    for path in sorted(Path(folder).rglob("ex[0-9][0-9]_*.py"), key=lambda p: len(p.parts)):
        parts = path.relative_to(folder).parts
        if any(p.startswith(".") or p == "__MACOSX" for p in parts):
            continue
        if not EXERCISE_FILE.match(path.name) or (known and path.stem not in known):
            continue
        found.setdefault(path.stem, path)
    return found


def reachable_tmp() -> str | None:
    """Where the grader's copy of a submission can go so that its unprivileged processes reach
    it: None (the temporary directory) unless the grader runs as root, whose student processes
    run as `nobody`; then $TMPDIR where every folder above it lets others through, else /tmp,
    else /dev/shm (a root-only TMPDIR would make every one-process test a PermissionError)."""
    if os.geteuid() != 0:
        return None
    for base in (tempfile.gettempdir(), "/tmp", "/dev/shm"):
        if others_can_enter(base):
            return base
    return None


def others_can_enter(path: str) -> bool:
    """Whether a user with no claim on them may pass through `path` and every folder above it."""
    try:
        where = Path(path).resolve()
        return all(os.stat(p).st_mode & 0o001 for p in (where, *where.parents))
    except OSError:
        return False


def admit(found: dict[str, Path], scratch: Path, solutions: Path) -> dict[str, list[str]]:
    """Copy each admissible file into `scratch` (readable by the grader's unprivileged
    processes); for a refused one, a module raising ImportError. Returns the refusals."""
    scratch.mkdir(parents=True, exist_ok=True)
    os.chmod(scratch, 0o755)
    refused = {}
    for exercise, path in found.items():
        reasons = policy.check(path, exercise, solutions)
        target = scratch / f"{exercise}.py"
        if reasons:
            refused[exercise] = reasons
            text = f"raise ImportError({'; '.join(reasons)!r})\n"
        else:
            text = path.read_text(errors="replace")
        target.write_text(text)
        os.chmod(target, 0o644)
    return refused
