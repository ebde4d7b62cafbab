"""The numbers lessons/*.md states about this machine, from recorded runs (minipar/course/
lesson_numbers.py explains the markers).

    python scripts/lesson_numbers.py record [NAME ...]  run the lessons the texts quote, keep
                                                       their records in lessons/records/
                                                       (NN: --quick; NN-nodes: --quick --nodes 2,
                                                       as root, NN-nodes-RATE on --link RATE;
                                                       NN-full: the full lesson)
    python scripts/lesson_numbers.py write             rewrite every marked number from them
    python scripts/lesson_numbers.py check             what disagrees (exit 1 if anything)

Record on a quiet machine: the record keeps the CPU share other processes took from the run
(`@lost`, from /proc/stat against the ranks' own CPU time) and the load average (`@load`) beside
the numbers, and the texts quote them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from minipar.course import lesson_numbers as numbers

ROOT = Path(__file__).resolve().parents[1]
TEXTS, RECORDS = ROOT / "lessons", ROOT / "lessons" / "records"


def quoted() -> set[str]:
    """The records the texts quote."""
    return {record for path in TEXTS.glob("*.md") for _, record, *_ in
            numbers.marks(path.read_text())}  # fmt: skip


def record(names) -> int:
    RECORDS.mkdir(exist_ok=True)
    status = 0
    for name in sorted(names or quoted()):
        lesson, _, how = name.partition("-")
        how, _, rate = how.partition("-")  # NN-nodes-200mbit: on that link
        args = {"": ["--quick"], "nodes": ["--quick", "--nodes", "2"], "full": []}[how]
        args += ["--link", rate] if rate else []
        out = RECORDS / f"{name}.json"
        cmd = [sys.executable, "-m", "minipar", "lesson", lesson, *args, "--json", str(out)]
        print(" ".join(cmd[1:]), flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            print(done.stdout[-2000:] + done.stderr[-2000:])
            status = 1
    return status


def write() -> int:
    for path in sorted(TEXTS.glob("*.md")):
        text = path.read_text()
        fresh = numbers.rewrite(text, RECORDS)
        if fresh != text:
            path.write_text(fresh)
            print(f"rewrote {path.relative_to(ROOT)}")
    return 0


def check() -> int:
    bad = [f"{path.name}: {line}" for path in sorted(TEXTS.glob("*.md"))
           for line in numbers.disagreements(path.read_text(), RECORDS)]  # fmt: skip
    print("\n".join(bad) or "every marked number agrees with its record")
    return 1 if bad else 0


if __name__ == "__main__":
    what, *rest = sys.argv[1:] or ["check"]
    raise SystemExit({"record": lambda: record(rest), "write": write, "check": check}[what]())
