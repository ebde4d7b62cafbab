"""A class graded in one command: every submission in a folder, each in a grader of its own.

    minipar grade --submissions uploads/ --out grades/ [--jobs 2] [--timeout 600] [--roster r.csv]

    uploads/alice/ex03_ring_allreduce.py        (a folder a student; nested folders flattened,
    uploads/bob.zip                              a .zip unpacked, as Gradescope's export has them)
      ->  grades/alice/results.json             Gradescope's format, always written
          grades/grades.csv                     a row a student, a column an exercise, the total
          grades/similarity.md                  the most alike pairs (for the instructor)

Each submission is graded by `minipar grade --impl` in a process of its own (behind the wall of
course/sandbox.py), under `timeout` seconds: one that does not finish gets a results.json of
zeros saying so; a hang inside it costs only its exercise (its case limit). A progress line per
submission says the time so far and an estimate of what is left.
"""

from __future__ import annotations

import concurrent.futures
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

from minipar.course import exercises, gradebook, handout, similarity, submission
from minipar.launcher import own_folder

HIDE_ALSO_ENV = "MINIPAR_GRADE_HIDE_ALSO"  # more paths the graded code may not open


def submissions(folder: Path, unpacked: Path) -> dict[str, Path]:
    """student -> the folder of their files: each sub-folder, each .zip (unpacked into
    `unpacked`); hidden entries skipped."""
    found = {}
    for entry in sorted(Path(folder).iterdir()):
        if entry.name.startswith((".", "__")):
            continue
        if entry.is_dir():
            found[entry.name] = entry
        elif entry.suffix == ".zip":
            target = unpacked / entry.stem
            with zipfile.ZipFile(entry) as archive:
                for member in archive.namelist():  # nothing outside its folder
                    if member.startswith("/") or ".." in Path(member).parts:
                        raise ValueError(f"{entry.name}: {member} would leave its folder")
                archive.extractall(target)
            found[entry.stem] = target
    if not found:
        raise FileNotFoundError(f"no submission in {folder}: a folder or a .zip per student")
    return found


def assignment(points: Path) -> tuple[list[str], dict[str, float]]:
    """The assignment's exercises (the points table's, else every one) and their points."""
    default, table = gradebook.points_table(points)
    names = list(table) or [p.stem for p in exercises.sources()]
    return names, {n: table.get(n, default) for n in names}


class Graders:
    """The graders running now, one a submission: a batch stopped part-way (Ctrl-C, SIGTERM,
    SIGHUP) stops them all, and starts none after."""

    def __init__(self):
        self.children: set = set()
        self.stopped = False
        self.lock = threading.Lock()

    def start(self, command: list[str], **popen):
        """The grader process, started; None once the batch is stopping."""
        with self.lock:
            if self.stopped:
                return None
            child = subprocess.Popen(command, start_new_session=True, **popen)
            self.children.add(child)
            return child

    def done(self, child) -> None:
        with self.lock:
            self.children.discard(child)

    def stop_all(self) -> None:
        """Every running grader stopped as a timeout stops one (_stop), side by side."""
        with self.lock:
            self.stopped = True
            children = list(self.children)
        stoppers = [threading.Thread(target=_stop, args=(c,)) for c in children]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()


def grade_one(
    name: str,
    folder: Path,
    out: Path,
    points: Path,
    timeout: float,
    hide: tuple = (),
    hidden_tests: Path | None = None,
    graders: Graders | None = None,
) -> dict | None:
    """Grade one submission in a `minipar grade` process of its own; its results.json (one of
    zeros if it did not finish). `hide`: paths its code may not open (every student's results
    and uploads: nothing of one student's process reaches another's grade or work)."""
    target = out / name
    target.mkdir(parents=True, exist_ok=True)
    results = target / "results.json"
    command = [sys.executable, "-m", "minipar", "grade", "--impl", str(folder), "--format",
               "gradescope", "--json", str(results), "--points", str(points)]  # fmt: skip
    command += ["--hidden-tests", str(hidden_tests)] if hidden_tests else []
    start, why = time.monotonic(), ""
    graders = graders or Graders()
    with open(target / "grader.log", "w") as log:
        env = {**os.environ, HIDE_ALSO_ENV: os.pathsep.join(str(h) for h in hide)}
        child = graders.start(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        if child is None:  # the batch is stopping: this one is not started
            return None
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            why = f"the grade of this submission did not finish within {timeout:g} s"
            _stop(child)
        finally:
            graders.done(child)
    if why or not results.exists():
        why = why or f"the grader ended (status {child.returncode}) without results"
        names, _ = assignment(points)
        failed = [_failed(n, why) for n in names]
        results.write_text(json.dumps(gradebook.gradescope(failed, gradebook.points_table(points)),
                                      indent=1))  # fmt: skip
    graded = json.loads(results.read_text())
    graded["minipar_seconds"] = round(time.monotonic() - start, 1)
    graded["minipar_status"] = "graded" if not why else why
    return graded


def _failed(exercise: str, why: str):
    return gradebook.Result(exercise, "grading", "failed", why)


def _stop(child) -> None:
    """Ctrl-C first (the grader closes its ranks' jobs), then SIGKILL to its whole session."""
    for sig, wait in ((signal.SIGINT, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def per_exercise(graded: dict) -> dict[str, float]:
    scores: dict[str, float] = {}
    for test in graded.get("tests", []):
        exercise = (test.get("tags") or ["?"])[0]
        scores[exercise] = scores.get(exercise, 0.0) + float(test.get("score", 0))
    return scores


def roster_names(path: Path) -> list[str]:
    """The students a roster lists: its column named name, student, sid, login or email (the
    first such), else its first column."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{path}: the roster is empty")
    header = [h.strip().lower() for h in rows[0]]
    column = next((header.index(k) for k in ("name", "student", "sid", "login", "email")
                   if k in header), 0)  # fmt: skip
    return [row[column].strip() for row in rows[1:] if len(row) > column and row[column].strip()]


def write_csv(path: Path, graded: dict[str, dict], names: list[str], worth: dict, roster) -> None:
    """grades.csv: student, each exercise's points, total, maximum, status, seconds (the
    submission's grade, start to end)."""
    most = sum(worth.values())
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["student", *names, "total", "max", "status", "seconds"])
        for student in sorted(set(graded) | set(roster or [])):
            if student not in graded:
                out.writerow([student, *["0"] * len(names), "0", f"{most:g}", "no submission", ""])
                continue
            scores = per_exercise(graded[student])
            status = graded[student].get("minipar_status", "graded")
            if roster is not None and student not in roster:
                status += "; not on the roster"
            row = [f"{scores.get(n, 0.0):g}" for n in names]
            seconds = graded[student].get("minipar_seconds", "")
            out.writerow([student, *row, f"{graded[student].get('score', 0):g}", f"{most:g}",
                          status, seconds])  # fmt: skip


def write_similarity(path: Path, folders: dict[str, Path], names: list[str], root: Path) -> int:
    """similarity.md: the pairs (students, the worked answers, the library's answers) whose
    written code is most alike; the number of pairs listed."""
    known = set(names)
    sources = {s: {ex: p.read_text(errors="replace")
                   for ex, p in submission.files(folder, known).items()}
               for s, folder in folders.items()}  # fmt: skip
    solutions = root / "solutions"
    given = {n: exercises.generated(solutions / f"{n}.py")[0] for n in names
             if (solutions / f"{n}.py").exists()}  # fmt: skip
    references = {"worked answer": {n: (solutions / f"{n}.py").read_text() for n in given},
                  "the library": handout.answer_texts(root / "minipar")}  # fmt: skip
    pairs = similarity.report(sources, references, given)
    lines = ["# Similarity (for the instructor; not a grade)", "",
             "Winnowed fingerprints of what each student wrote (the stub left out), names and "
             "numbers ignored; share: of the smaller file's fingerprints, how many the other has.",
             "", "| share | exercise | who | whom |", "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {s:.0%} | {ex} | {a} | {b} |" for s, ex, a, b in pairs[:200]]
    if not pairs:
        lines.append("| - | no pair shares half its fingerprints | | |")
    path.write_text("\n".join(lines) + "\n")
    return len(pairs)


def grade_all(
    folder: Path,
    out: Path,
    jobs: int = 1,
    timeout: float = 600.0,
    roster: Path | None = None,
    points: Path | None = None,
    say=print,
    hidden_tests: Path | None = None,
) -> dict:
    """Grade every submission of `folder` into `out`; {student: results} and the files."""
    root = exercises.repo_root()
    points = points or root / "solutions" / "points.toml"
    names, worth = assignment(points)
    listed = roster_names(roster) if roster else None
    out.mkdir(parents=True, exist_ok=True)
    # named after this process: a SIGKILLed batch's copy is swept by the next grade
    with tempfile.TemporaryDirectory(prefix=own_folder.prefix("batch")) as unpacked:
        folders = submissions(folder, Path(unpacked))
        graded, start, graders = {}, time.monotonic(), Graders()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
        try:
            hide = (out.resolve(), Path(folder).resolve(), Path(unpacked).resolve())
            futures = {pool.submit(grade_one, s, f, out, points, timeout, hide, hidden_tests,
                                   graders): s for s, f in folders.items()}  # fmt: skip
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                student = futures[future]
                graded[student] = future.result()
                spent = time.monotonic() - start
                left = spent / done * (len(folders) - done)
                say(f"[{done}/{len(folders)}] {student}: {graded[student].get('score', 0):g} of "
                    f"{sum(worth.values()):g} in {graded[student]['minipar_seconds']:g} s "
                    f"({spent:.0f} s so far, about {left:.0f} s left)")  # fmt: skip
        except BaseException:  # Ctrl-C, SIGTERM: the graders stop and clean up, then this
            graders.stop_all()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        write_csv(out / "grades.csv", graded, names, worth, listed)
        alike = write_similarity(out / "similarity.md", folders, names, root)
    say(
        f"graded {len(graded)} submissions in {time.monotonic() - start:.0f} s: {out}/grades.csv, "
        f"{out}/similarity.md ({alike} pairs at half or more), {out}/NAME/results.json"
    )
    return graded
