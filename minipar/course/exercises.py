"""The student exercises, generated from the worked solutions (`minipar exercises`, whose face is
minipar/cli/exercises.py).

    minipar exercises                 each exercise, its lesson, and how far exercises/ has got
    minipar exercises --generate      rewrite exercises/ from solutions/ (instructors)
    minipar exercises --check         exit 1 if exercises/ is not what --generate would write

One source, no drift: `solutions/exNN_name.py` holds the answers, and the parts a student writes
sit between marker comments,

    # BEGIN SOLUTION hint: send chunk (r - s - 1) % p to the right ...
    # hint: (more hint, optional)
    ...the answer...
    # END SOLUTION

which `--generate` replaces by `raise NotImplementedError("<the hint>")`, at the same indent.
The student's side (where the files are, loading one, `register()` that plugs a student's
algorithms into minipar) is minipar/exercises.py.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from minipar.exercises import load, repo_root, tree  # noqa: F401  (the grader reads them here)

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION(?:\s+hint:\s*(?P<hint>.*))?$")
HINT = re.compile(r"^\s*# hint:\s*(?P<hint>.*)$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
HEADER = (
    "# Generated from solutions/{name} by `minipar exercises --generate`: write your code where\n"
    "# it raises NotImplementedError, then check it with `minipar grade {lesson}`.\n"
)
README = """\
# Exercises

Generated from `solutions/` by `minipar exercises --generate`; do not edit by hand what you do
not mean to solve. Each file says which lesson it belongs to. Write your code where a function
raises `NotImplementedError` (the message is a hint), then grade it:

    minipar grade            # every exercise
    minipar grade 03         # the exercises of lesson 03

Your functions have the same signature as minipar's own algorithms, so once they pass they can
power minipar itself: `minipar.all_reduce(x, algorithm=all_reduce_ring)`.
"""


def sources(solutions: Path | None = None) -> list[Path]:
    return sorted((solutions or tree("solutions")).glob("ex[0-9][0-9]_*.py"))


NO_HINT = "write this part"


def strip(text: str, where: str = "solution", hints: bool = True) -> tuple[str, int]:
    """The exercise version of a solution file's text, and the number of blocks replaced;
    without hints every block raises the same bare message (for instructors who grade)."""
    out, blocks, lines, i = [], 0, text.splitlines(), 0
    while i < len(lines):
        begin = BEGIN.match(lines[i])
        if not begin:
            if END.match(lines[i]):
                raise ValueError(f"{where}:{i + 1}: END SOLUTION without a BEGIN")
            out.append(lines[i])
            i += 1
            continue
        hint = [begin["hint"] or ""]
        start, i = i, i + 1
        while i < len(lines) and HINT.match(lines[i]):
            hint.append(HINT.match(lines[i])["hint"])
            i += 1
        while i < len(lines) and not END.match(lines[i]):
            if BEGIN.match(lines[i]):
                raise ValueError(f"{where}:{i + 1}: BEGIN SOLUTION inside the block at {start + 1}")
            i += 1
        if i == len(lines):
            raise ValueError(f"{where}:{start + 1}: BEGIN SOLUTION is never closed")
        message = " ".join(h.strip() for h in hint if h.strip()) if hints else ""
        message = message or NO_HINT
        out.extend(_raise(begin["indent"], message))
        blocks += 1
        i += 1
    return "\n".join(out) + "\n", blocks


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _raise(indent: str, message: str) -> list[str]:
    """`raise NotImplementedError("message")`, the message wrapped to fit 100 columns."""
    one = f"{indent}raise NotImplementedError({_quoted(message)})"
    if len(one) <= 100:
        return [one]
    width = 100 - len(indent) - 8
    pieces = textwrap.wrap(message, width, drop_whitespace=False, break_on_hyphens=False)
    return [
        f"{indent}raise NotImplementedError(",
        *(f"{indent}    {_quoted(piece)}" for piece in pieces),
        f"{indent})",
    ]


def lesson_of(path: Path) -> str:
    return path.name[2:4]


def generated(path: Path, hints: bool = True) -> tuple[str, int]:
    """What exercises/<name> should contain, for solutions file `path`."""
    body, blocks = strip(path.read_text(), str(path), hints)
    return HEADER.format(name=path.name, lesson=lesson_of(path)) + body, blocks


def expected_files(solutions: Path | None = None, hints: bool = True) -> dict[str, str]:
    """file name -> the text --generate writes (the README and one file per solution)."""
    files = {"README.md": README}
    for path in sources(solutions):
        files[path.name] = generated(path, hints)[0]
    return files


def stale(
    exercises: Path | None = None, solutions: Path | None = None, hints: bool = True
) -> list[str]:
    """Names of the files in exercises/ that differ from (or are missing against) the solutions."""
    exercises = exercises or tree("exercises")
    wrong = []
    for name, text in expected_files(solutions, hints).items():
        path = exercises / name
        if not path.exists() or path.read_text() != text:
            wrong.append(name)
    return wrong


def remaining(path: Path) -> int:
    """How many `raise NotImplementedError` lines a file still has (work left to do)."""
    return sum("raise NotImplementedError(" in line for line in path.read_text().splitlines())


def generate(exercises: Path | None = None, force: bool = False, hints: bool = True) -> list[str]:
    """Write exercises/ from solutions/; refuses to overwrite a file a student has started
    (fewer NotImplementedErrors than a fresh copy) unless force. Returns the files written.
    hints=False: each NotImplementedError says only "write this part"."""
    exercises = exercises or tree("exercises")
    exercises.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in expected_files(hints=hints).items():
        path = exercises / name
        if path.exists() and path.read_text() == text:
            continue
        if path.exists() and not force and name != "README.md":
            fresh = text.count("raise NotImplementedError(")
            if remaining(path) < fresh:
                raise ValueError(
                    f"{path} has {fresh - remaining(path)} of {fresh} parts filled in (a "
                    "student's work?); use --force to overwrite it"
                )
        path.write_text(text)
        written.append(name)
    return written
