"""Time a class graded on this machine (issue 69's goal): N submissions of the whole course,
every grade checked against what it must be.

    python scripts/grade_class.py                 60 submissions, 1 at a time
    python scripts/grade_class.py -n 12 --jobs 2  fewer, two at a time

The class (a seed makes it the same every run): worked answers (every exercise full marks),
untouched hand-outs (0), slips (one planted mistake from tests/planted.py: that exercise below
its points, every other at its points), and one submission with a rank that never returns in
ex02_broadcast_linear (that exercise 0, every other at its points). Prints each kind's grades
against the expected, the seconds per submission (min / median / max), the machine's peak
memory in use while grading (MemAvailable), and the CPU the run did not get (/proc/stat).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from planted import PLANTED  # noqa: E402  (the slips: tests/planted.py)

SPIN = (
    "    if call.rank == root:\n",
    "    while call.rank == 1:\n        pass\n    if call.rank == root:\n",
)


def _sources(folder: str) -> dict[str, str]:
    return {p.stem: p.read_text() for p in (ROOT / folder).glob("ex[0-9][0-9]_*.py")}


def submission(kind: str, rng: random.Random) -> tuple[dict[str, str], str | None]:
    """One submission of `kind` (worked, stub, slip, hang): its files (stem -> text) and the
    exercise that differs from the worked answers (None: none, or all for a stub)."""
    solutions = _sources("solutions")
    files, odd = dict(solutions), None
    if kind == "stub":
        files = _sources("exercises")
    elif kind == "slip":
        exercise, _, old, new, _ = rng.choice([p for p in PLANTED if p[2] in solutions[p[0]]])
        files[exercise], odd = files[exercise].replace(old, new, 1), exercise
    elif kind == "hang":
        files["ex02_broadcast_linear"] = files["ex02_broadcast_linear"].replace(*SPIN, 1)
        odd = "ex02_broadcast_linear"
    return files, odd


def write_submission(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True)
    for stem, text in files.items():
        (folder / f"{stem}.py").write_text(text)


def make_class(folder: Path, n: int, seed: int = 0) -> dict[str, tuple[str, str | None]]:
    """n submissions in folder/NAME/; NAME -> (kind, the exercise that differs)."""
    rng = random.Random(seed)
    kinds = ["hang"] + [["worked", "stub", "slip"][i % 3] for i in range(n - 1)]
    made = {}
    for i, kind in enumerate(kinds):
        name = f"s{i:02d}_{kind}"
        files, odd = submission(kind, rng)
        write_submission(folder / name, files)
        made[name] = (kind, odd)
    return made


def grade_is_right(kind: str, odd: str | None, exercise: str, got: float, points: float) -> bool:
    """What a kind of submission must get on one exercise: a stub 0; a worked answer, and every
    exercise but the odd one, full points; the odd one 0 for a hang, below its points for a
    slip."""
    if kind == "stub":
        return got == 0
    if exercise != odd:
        return got == points
    return got == 0 if kind == "hang" else got < points


def memory_sampler(stop: threading.Event, seen: list) -> None:
    def available() -> int:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
        return 0

    base = available()
    while not stop.wait(0.5):
        seen.append(base - available())


def cpu_times() -> tuple[float, float]:
    fields = [float(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]  # all, idle + iowait


def check(out: Path, made: dict, worth: dict) -> list[str]:
    """Every submission's grade against what its kind must get; the wrong ones."""
    rows = {r["student"]: r for r in csv.DictReader(open(out / "grades.csv"))}
    wrong = []
    for name, (kind, odd) in made.items():
        row = rows[name]
        for exercise, points in worth.items():
            got = float(row[exercise])
            if not grade_is_right(kind, odd, exercise, got, points):
                wrong.append(f"{name} ({kind}): {exercise} {got:g} of {points:g}")
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=60)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--keep", default=None, help="keep the class and grades in this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="minipar-class-") as tmp:
        top = Path(args.keep) if args.keep else Path(tmp)
        made = make_class(top / "uploads", args.n)
        stop, seen = threading.Event(), []
        sampler = threading.Thread(target=memory_sampler, args=(stop, seen), daemon=True)
        sampler.start()
        cpu0, start = cpu_times(), time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "minipar", "grade", "--submissions", str(top / "uploads"),
             "--out", str(top / "out"), "--jobs", str(args.jobs)], cwd=ROOT,
        )  # fmt: skip
        wall, cpu1 = time.monotonic() - start, cpu_times()
        stop.set()
        sys.path.insert(0, str(ROOT))
        from minipar.course import gradebook

        default, table = gradebook.points_table(ROOT / "solutions" / "points.toml")
        worth = dict(table)
        wrong = check(top / "out", made, worth)
        seconds = [json.loads((top / "out" / n / "results.json").read_text())["execution_time"]
                   for n in made]  # fmt: skip
        rows = list(csv.DictReader(open(top / "out" / "grades.csv")))
        spent = sorted(float(r["seconds"]) for r in rows if r["seconds"])
        busy = 1 - (cpu1[1] - cpu0[1]) / max(cpu1[0] - cpu0[0], 1e-9)
        status = f"exit {done.returncode}"
        print(f"{len(made)} submissions, --jobs {args.jobs}: {wall:.0f} s in all; {status}")
        print(f"seconds a submission (its grader's wall time): min {spent[0]:.1f} / median "
              f"{statistics.median(spent):.1f} / max {spent[-1]:.1f}; tests' own time median "
              f"{statistics.median(seconds):.1f} s")  # fmt: skip
        peak = max(seen, default=0) / 2**30
        print(f"peak memory in use while grading: {peak:.2f} GiB above the start")
        print(f"the machine's CPU busy during the run: {busy:.0%} (all processes)")
        print("grades: every one right" if not wrong else f"{len(wrong)} wrong grades:")
        for line in wrong[:20]:
            print("  " + line)
        return 0 if not wrong else 1


if __name__ == "__main__":
    raise SystemExit(main())
