"""`minipar grade`: run the exercises' tests against exercises/ (or solutions/) and report.

    minipar grade                 every exercise in exercises/
    minipar grade 03              only lesson 03's exercises (or one by name)
    minipar grade 03 --hints      and a hint for each part not started (from solutions/)
    minipar grade --impl DIR      the exNN_*.py files a folder holds (a student's copy)
    minipar grade ex04_hierarchical_allreduce --nodes 2     on emulated nodes (root)
    minipar grade --solutions     the worked answers (instructors, CI: all must pass)
    minipar grade --format gradescope --json results.json     (or --format junit: JUnit XML)

The tests are tests/test_exercises.py, the same ones CI runs against solutions/; the grader runs
pytest on them with `--impl` and sorts each test into passed, failed (with the first line of the
error: whole, never cut) or not started (the exercise still raises NotImplementedError). Each
failure says where the work parts from the worked answer, in the exercise's words; a failed
multi-rank test also explains itself (minipar.course.stepdiff): the first step where the
student's messages or buffers part from the worked solution's, as a table of that step on every
rank, the failing rank's error first and the others' as what followed (course/stopping.py stops
them at once). After an exercise's first failure its later tests are not run. The ranks run only
the chosen exercises' cases; waits time out after GRADE_TIMEOUT seconds (MINIPAR_TIMEOUT
overrides it), so a deadlock is named within seconds. Progress goes to stderr (Progress). Exit
status 0 only when every test passed. SIGTERM or SIGHUP stops a grade as Ctrl-C does, with
nothing left behind (exit 128 + the signal's number; --json's file says it was stopped); what a
SIGKILLed grade left, the next grade removes (launcher/own_folder.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

from minipar.course import batch, exercises, gradebook, sandbox, submission
from minipar.course.gradebook import Result
from minipar.course.stepdiff import SENTINEL
from minipar.launcher import own_folder, stop
from minipar.launcher.cluster import leftovers, needs
from minipar.launcher.cluster.nodes import EmulationError
from minipar.testing import harness, pool

TESTS = Path("tests") / "test_exercises.py"
GRADE_TIMEOUT = "5"  # seconds any wait may take while grading: a deadlock is named quickly
FORMATS = ("text", "json", "gradescope", "junit")
HUNG = re.compile(r"no result from ranks \[([\d, ]+)\]: ranks \[[\d, ]+\] were still inside the "
                  r"case (\d+) s")  # fmt: skip
FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\w+)')  # faulthandler's stack lines
EXERCISE_FRAME = re.compile(r"ex\d\d_\w+\.py$")
EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit))\b:?\s*(.*)$")


def _exercise_and_test(nodeid: str) -> tuple[str, str]:
    """('ex03_ring_allreduce', 'values on 4 ranks') from a test id. Multi-rank tests are
    test_ranks[SIZE-EXERCISE/CASE]; the others are named test_EXERCISE_WHAT[PARAMS]."""
    name = nodeid.split("::")[-1]
    ranks = re.fullmatch(r"test_ranks\[(\d+)-(ex\d\d_\w+)/(.+)\]", name)
    if ranks:
        size, exercise, what = ranks.groups()
        return exercise, f"{what} on {size} rank{'' if size == '1' else 's'}"
    for stem in sorted((p.stem for p in exercises.sources()), key=len, reverse=True):
        if name.startswith(f"test_{stem}"):
            return stem, name[len(stem) + 5 :].lstrip("_") or name
    return "?", name


def _last_error(traceback_text: str) -> tuple[str, str] | None:
    """(exception name, message) of the last exception line of a formatted traceback."""
    found = None
    for line in traceback_text.splitlines():
        match = EXCEPTION_LINE.match(line.strip())
        if match:
            found = match.groups()
    return found


def _where_stuck(section: str) -> tuple[bool, str] | None:
    """(spinning, 'FILE:LINE in FUNCTION') of the exercise's frame in one rank's stacks
    (faulthandler's, most recent call first): spinning when no call is above it in its thread
    (its own loop, not a wait on another rank); None without an exercise frame."""
    for block in re.split(r"\n(?=Thread 0x|Current thread)", section):
        frames = FRAME.findall(block)
        for i, (path, line, function) in enumerate(frames):
            if EXERCISE_FRAME.search(path):
                return i == 0, f"{Path(path).name}:{line} in {function}"
    return None


def hang_words(message: str, seconds: str) -> str:
    """'rank 1 did not return within 30 s (hung): at ex02_x.py:22 in f; rank 0 waited on it'
    from a hung case's message: the ranks spinning in the exercise's own code are the cause,
    the ranks waiting are named after them; all waiting is a deadlock."""
    sections = re.split(r"--- rank (\d+) output ---", message)
    stuck = {int(r): _where_stuck(text) for r, text in zip(sections[1::2], sections[2::2])}
    spinning = {r: w[1] for r, w in stuck.items() if w and w[0]}
    waiting = {r: w[1] for r, w in stuck.items() if w and not w[0]}
    if spinning:
        first = min(spinning)
        said = f"rank {first} did not return within {seconds} s (hung): at {spinning[first]}"
        others = sorted(set(stuck) - {first})
        return said + (f"; ranks {others} waited on it" if others else "")
    if waiting:
        places = "; ".join(f"rank {r} at {w}" for r, w in sorted(waiting.items()))
        return f"ranks {sorted(waiting)} waited on each other for {seconds} s (deadlock): {places}"
    return f"ranks {sorted(stuck)} did not return within {seconds} s (hung)"


def classify(error: BaseException | None) -> tuple[str, str]:
    """(status, detail) for a test's outcome: `error` is the exception it raised (None if it
    passed). Multi-rank failures arrive as one AssertionError holding every rank's traceback;
    the first failing rank's own last error is the one reported."""
    if error is None:
        return "passed", ""
    if isinstance(error, NotImplementedError):
        return "not started", str(error)
    message = str(error).strip()
    hung = HUNG.search(message)
    if hung:  # a rank that never returned is the cause, whatever the others then said
        return "failed", hang_words(message, hung.group(2))
    if "--- rank" in message:
        found = _last_error(message.split("--- rank", 2)[1].partition(SENTINEL)[0])
        if found and found[0] == "NotImplementedError":
            return "not started", found[1]
        if found and found[0] == "ExplainedError":  # it names the case's own error first
            return "failed", found[1]
        if found:
            return "failed", f"{found[0]}: {found[1]}"
    first = message.splitlines()[0] if message else ""
    if isinstance(error, AssertionError):
        return "failed", first or "AssertionError"
    return "failed", f"{type(error).__name__}: {first}"


def explanation(error: BaseException | None) -> str:
    """The grader's explanation in the first failing rank's error (below SENTINEL), or ''."""
    message = str(error or "")
    section = message.split("--- rank", 2)[1] if "--- rank" in message else message
    if SENTINEL not in section:
        return ""
    return section.partition(SENTINEL)[2].strip("\n").rstrip()


class Collector:
    """A pytest plugin that keeps each test's outcome and exception."""

    def __init__(self, hidden: tuple = ()):
        self.results: list[Result] = []
        self.hidden = {Path(h).resolve() for h in hidden}  # the instructor's hidden test files
        self.stopped: BaseException | None = None  # Ctrl-C, SIGTERM or SIGHUP: no grade

    def pytest_keyboard_interrupt(self, excinfo):
        """pytest ends the session on it (its clean-ups run) and returns: run() raises it."""
        self.stopped = excinfo.value

    def _record(self, item, error, seconds: float) -> None:
        exercise, test = _exercise_and_test(item.nodeid)
        status, detail = classify(error)
        why = explanation(error) if status == "failed" else ""
        secret = Path(str(item.fspath)).resolve() in self.hidden
        self.results.append(Result(exercise, test, status, detail, why, round(seconds, 3), secret))

    def pytest_collectreport(self, report):
        """A test file that does not even import (a syntax error in the tests, a missing
        dependency): one failed result saying so, not "no tests ran"."""
        if report.failed:
            text = str(report.longrepr).strip().splitlines()
            last = next((line for line in reversed(text) if line.strip()), "")
            where = report.nodeid or "the tests"
            self.results.append(Result("?", f"collecting {where}", "failed", last.lstrip("E ")))

    def pytest_runtest_makereport(self, item, call):
        if call.excinfo is not None and call.excinfo.typename == "Skipped":
            # "not run: ..." (an exercise's test after its first failure) still fails, so its
            # points stay split over every test ("not started: ..." stays not started); any
            # other skip is no test of the exercise
            said = str(call.excinfo.value.msg)
            exercise, test = _exercise_and_test(item.nodeid)
            if said.startswith(NOT_RUN):
                self.results.append(Result(exercise, test, "failed", said))
            elif said.startswith(NOT_STARTED):
                self.results.append(Result(exercise, test, "not started", said[len(NOT_STARTED) :]))
            return
        if call.when == "call":
            self._record(item, call.excinfo.value if call.excinfo else None, call.duration)
        elif call.when == "setup" and call.excinfo is not None:
            self._record(item, call.excinfo.value, call.duration)


class Progress:
    """A pytest plugin that says what is being graded, on stderr: which test of how many, on how
    many ranks, and the time so far, with a line every HEARTBEAT seconds while a test runs (the
    first test on N ranks starts their job, which runs them all). On a terminal the waiting
    line is rewritten in place; elsewhere (a log, a course platform) each is a plain line."""

    HEARTBEAT = 3.0

    def __init__(self, stream=None):
        # a copy of the stderr descriptor: pytest captures fd 2 itself while a test runs
        self.stream = stream or open(os.dup(2), "w", buffering=1)  # noqa: SIM115 - closed below
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.total, self.done, self.what = 0, 0, ""
        self.start = self.since = time.monotonic()
        self._stop = threading.Event()
        self._thread = None

    def _say(self, text: str, transient: bool = False) -> None:
        if self.tty:
            end = "" if transient else "\n"
            self.stream.write("\r\x1b[2K" + text + end)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def pytest_collection_finish(self, session):
        self.total = len(session.items)
        self._say(f"grading: {self.total} tests")
        self._thread = threading.Thread(target=self._beat, name="grade-progress", daemon=True)
        self._thread.start()

    def pytest_runtest_logstart(self, nodeid, location):
        exercise, test = _exercise_and_test(nodeid)
        self.done += 1
        self.what, self.since = f"[{self.done}/{self.total}] {exercise}: {test}", time.monotonic()
        self._say(f"{self.what} ({time.monotonic() - self.start:.0f} s so far)", transient=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.HEARTBEAT):
            now = time.monotonic()
            if self.what and now - self.since >= self.HEARTBEAT:
                self._say(
                    f"{self.what}: running {now - self.since:.0f} s ({now - self.start:.0f} s "
                    "so far)",
                    transient=True,
                )

    def pytest_sessionfinish(self, session):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._say(f"graded {self.done} tests in {time.monotonic() - self.start:.0f} s")
        if self.stream.fileno() > 2:
            self.stream.close()


@contextlib.contextmanager
def _short_timeouts():
    """GRADE_TIMEOUT for the ranks' waits, unless the user set MINIPAR_TIMEOUT."""
    if "MINIPAR_TIMEOUT" in os.environ:
        yield
        return
    os.environ["MINIPAR_TIMEOUT"] = GRADE_TIMEOUT
    try:
        yield
    finally:
        del os.environ["MINIPAR_TIMEOUT"]


NOT_RUN = "not run: "  # tests/test_exercises.py's skip of a test after its exercise failed
NOT_STARTED = "not started: "  # ... or after it raised NotImplementedError
ONLY_ENV = "MINIPAR_EXERCISES_ONLY"  # the ranks run only these exercises' cases
NODES_ENV = "MINIPAR_GRADE_NODES"  # tests/test_exercises.py: the ranks on emulated nodes


def selection(lesson: str | None, impl: str, folder: Path) -> list[str] | None:
    """The exercises to grade, by name: a lesson's (03), one by name, or those a folder of
    one's own (--impl) holds; None: every one."""
    names = [p.stem for p in exercises.sources()]
    if lesson:
        chosen = [
            n
            for n in names
            if n.startswith(f"ex{int(lesson):02d}_" if lesson.isdigit() else lesson)
        ]
        return chosen or [lesson]
    if impl in ("exercises", "solutions"):
        return None
    held = sorted(submission.files(folder, set(names)))  # nested uploads flattened
    if not held:
        raise FileNotFoundError(f"no exNN_*.py exercise in {folder}")
    return held


def _only(chosen):
    """ONLY_ENV names the chosen exercises while grading (tests/ranks/exercises.py reads it):
    the ranks' jobs then run their cases and no others."""
    return _environ(ONLY_ENV, ",".join(chosen) if chosen is not None else None)


@contextlib.contextmanager
def _environ(name: str, value: str | None):
    """os.environ[name] = value inside the block (None: left as it is)."""
    saved = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def run(
    impl: str = "exercises",
    lesson: str | None = None,
    root: Path | None = None,
    verbose: bool = False,
    progress: bool = True,
    nodes: int | None = None,
    hide: tuple = (),
    hidden_tests: Path | None = None,
) -> list[Result]:
    """Run the exercise tests against `impl`; the results, one per test. The worked answers
    (solutions/) run here as they are; anything else goes through the grader's wall
    (course/sandbox.py): each file checked against its exercise's policy and copied to a folder
    of its own, its one-process functions run in a child process, its ranks with the answers
    and `hide` (the results file, hidden tests) refused to them. This process never imports
    a student's file. `hidden_tests`: a folder of the instructor's own test_*.py files, run
    beside the public ones (their results after the due date, unless points.toml says)."""
    import pytest

    root = root or exercises.repo_root()
    tests = root / TESTS
    if not tests.exists() and exercises.EDITION == "student":
        raise FileNotFoundError(
            "this is a course's student edition: its grader runs on the course's server, with "
            "tests you do not have; hand in your exercises/ files there (your library already "
            "runs them: minipar.all_reduce(x, algorithm='ring') runs your ring)"
        )
    if not tests.exists():
        raise FileNotFoundError(f"{tests} not found: grade from a clone of the repository")
    folder = exercises.tree(impl)
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder {folder}")
    chosen = selection(lesson, impl, folder)
    walled = folder != exercises.tree("solutions")
    if walled and chosen is None:  # the ranks read the chosen exercises' answers first
        chosen = sorted(submission.files(folder, {p.stem for p in exercises.sources()}))
    extra = sorted(Path(hidden_tests).glob("test_*.py")) if hidden_tests else []
    if hidden_tests and not extra:
        raise FileNotFoundError(f"--hidden-tests {hidden_tests}: no test_*.py file in it")
    collector = Collector(tuple(extra))
    if nodes:
        needs.check("minipar grade --nodes")  # everything it lacks, before any rank starts
    leftovers.sweep_grader()  # what a killed grader left: SIGKILL runs no clean-up
    with contextlib.ExitStack() as stack:
        # SIGTERM and SIGHUP (a platform's time limit, a closed terminal) stop the grade as
        # Ctrl-C does: every clean-up below runs (the copy, the wall's child, the nodes, the
        # tests' folders); by default they would end this process with none
        stack.enter_context(stop.signals_raise(once=True))
        if walled:
            secret = [str(hidden_tests)] if hidden_tests else []
            folder = stack.enter_context(
                _walled(folder, chosen, [*hide, *secret, str(root / "solutions")])
            )
        stack.enter_context(_environ(sandbox.IMPL_ENV, str(folder)))  # the hidden tests' exercise()
        args = [str(tests), *map(str, extra), f"--impl={folder}", "-p", "no:cacheprovider"]
        args += ["-p", "no:xdist", "--rootdir", str(root)]
        args += ["-p", "no:benchmark"]  # pytest-benchmark, where installed, leaves .benchmarks/
        if not verbose:  # the report is ours; pytest's own output only with --verbose (kept
            # off the screen, not switched off: without its terminal plugin pytest loses the
            # message of some failed asserts)
            args += ["-o", "addopts=", "-q"]
        if chosen is not None:
            args += ["-k", " or ".join(chosen)]
        stack.enter_context(_short_timeouts())
        stack.enter_context(_only(chosen))
        stack.enter_context(_environ(NODES_ENV, str(nodes) if nodes else None))
        # one warm job at a time: the cases go by world size in order, so a job is not used
        # again once the next size starts, and each rank holds ~100 MB of its own
        stack.enter_context(_environ(pool.WARM_ENV, "0"))
        if not nodes:  # the fork server imports torch while pytest collects and the
            harness.pool().start_fork_server()  # one-process tests run: ~3 s a grade
        quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
        with quiet:
            pytest.main(args, plugins=[collector, *([Progress()] if progress else [])])
        if collector.stopped is not None:
            raise collector.stopped
    return collector.results


@contextlib.contextmanager
def _walled(folder: Path, chosen, hidden: list[str]):
    """A private copy of the submission's admissible files (course/submission.py), with this
    process sealed (its exercises.load() goes through the wall) and `hidden` refused to every
    process that runs student code (but never a folder holding the copy, this Python or
    minipar: an --out of "." hides the results file, not the package); the copy and the
    student's processes gone afterwards."""
    import tempfile

    known = {p.stem for p in exercises.sources()}
    found = submission.files(folder, known)
    if chosen is not None:
        found = {k: v for k, v in found.items() if k in chosen}
    where = submission.reachable_tmp()  # as root, a folder `nobody` can enter
    with tempfile.TemporaryDirectory(prefix=own_folder.prefix("grade"), dir=where) as scratch:
        submission.admit(found, Path(scratch), exercises.tree("solutions"))
        needed = [Path(scratch), Path(sys.prefix), Path(__file__).resolve().parents[1]]
        hide = os.pathsep.join(str(h) for h in map(lambda h: Path(h).resolve(), hidden)
                               if not any(n == h or h in n.parents for n in needed))  # fmt: skip
        answers = str(exercises.tree("solutions"))
        cover = os.pathsep.join(h for h in hide.split(os.pathsep) if h and h != answers)
        with (
            _environ(sandbox.SEALED_ENV, str(os.getpid())),
            _environ(sandbox.HIDE_ENV, hide),
            _environ(sandbox.COVER_ENV, cover),
        ):
            try:
                yield Path(scratch)
            finally:
                sandbox.close_all()


# -- the command ---------------------------------------------------------------------------------

EXAMPLES = """\
examples (students):
  minipar grade                   grade every exercise in exercises/
  minipar grade 03                only lesson 03's exercises
  minipar grade ex03_ring_allreduce          one exercise
  minipar grade 03 --hints        and a hint for each part not started yet
  minipar grade --impl ~/mine     a folder holding your own exNN_*.py files (those it holds)
  minipar grade ex04_hierarchical_allreduce --nodes 2    on 2 emulated nodes (root)

examples (instructors, CI):
  minipar grade --solutions       the worked answers: all must pass
  minipar grade --json out.json   also write the results as JSON (for a course's records)
  minipar grade --format gradescope --json /autograder/results/results.json
  minipar grade --format junit --json report.xml      JUnit XML (GitHub Classroom, CI)
"""


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    parser.add_argument(
        "lesson",
        nargs="?",
        default=None,
        metavar="NN",
        help="only this lesson's exercises (e.g. 03, 06), or one exercise by name",
    )
    parser.add_argument("--impl", default=None, metavar="DIR", help="grade the files in DIR")
    parser.add_argument(
        "--hints",
        action="store_true",
        help="show a hint for each part not started yet (hints give much of an answer away)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="run the multi-rank tests on N emulated nodes (root; docs/cluster.md), e.g. "
        "ex04_hierarchical_allreduce --nodes 2",
    )
    course = parser.add_argument_group("instructors and course platforms")
    course.add_argument(
        "--hidden-tests",
        default=None,
        metavar="DIR",
        help="your own test_*.py files (kept from students), run beside ours",
    )
    course.add_argument(
        "--submissions",
        default=None,
        metavar="DIR",
        help="grade a class: a folder (or .zip) a student in DIR, into --out",
    )
    course.add_argument(
        "--out",
        default=None,
        metavar="OUT",
        help="with --submissions: OUT/NAME/results.json, grades.csv, similarity.md",
    )
    course.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="with --submissions: N submissions at once (default 1)",
    )
    course.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="with --submissions: seconds one submission's grade may take",
    )
    course.add_argument(
        "--roster",
        default=None,
        metavar="CSV",
        help="with --submissions: every student listed gets a row, submitted or not",
    )
    course.add_argument(
        "--solutions", action="store_true", help="grade the worked answers, solutions/"
    )
    course.add_argument(
        "--json",
        "--output",
        dest="output",
        default=None,
        metavar="PATH",
        help="write the results here, in --format (json unless told)",
    )
    course.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="what --json writes: json (default), gradescope (results.json), junit (XML); "
        "without --json, gradescope and junit go to stdout",
    )
    course.add_argument(
        "--points",
        default=None,
        metavar="TOML",
        help="points per exercise (default: solutions/points.toml)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output")


STYLE = {"passed": "green", "failed": "bold red", "not started": "yellow"}


def verdict(mine: list[Result]) -> str:
    if all(r.status == "passed" for r in mine):
        return "passed"
    return "not started" if all(r.status == "not started" for r in mine) else "failed"


def report(console, results: list[Result], impl: str, shown: int = 3, hints: bool = False) -> None:
    """For each exercise, its first failures (each error's first line) and the grader's
    explanation of the first one that has one, or (with hints) the hint of an exercise not
    started yet; then one row per exercise (counts and verdict) and the totals."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    by_exercise: dict[str, list[Result]] = {}
    for r in results:
        by_exercise.setdefault(r.exercise, []).append(r)
    table = Table(title=f"minipar grade: {impl}", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("exercise", "passed", "failed", "not run", "not started", "result"):
        table.add_column(col, justify="left" if col in ("exercise", "result") else "right")
    for exercise, mine in sorted(by_exercise.items()):
        counts = [sum(kind(r) == s for r in mine) for s in KINDS]
        v = verdict(mine)
        table.add_row(exercise, *map(str, counts), f"[{STYLE[v]}]{v}[/]")
    for exercise, mine in sorted(by_exercise.items()):
        failed = [r for r in mine if r.status == "failed"]
        waiting = [r for r in mine if r.status == "not started"]
        ran = [r for r in failed if not r.detail.startswith(NOT_RUN)]
        if failed:
            console.print(f"[bold red]{exercise}[/]: {len(failed)} failed")
            for r in ran[:shown]:
                # one line each, never cut: the terminal wraps it, a log keeps it whole
                console.print(f"  {escape(r.test)}: {escape(r.detail)}", soft_wrap=True)
            if len(ran) > shown:
                console.print(f"  ... and {len(ran) - shown} more")
            explained = next((r for r in ran if r.explanation), None)
            if explained:
                only_after = " failed first; " in explained.explanation.splitlines()[0]
                title = f"where {explained.test} parts from the solution:"
                console.print(f"  [bold]{escape(f'{explained.test}:' if only_after else title)}[/]")
                for line in explained.explanation.splitlines():  # a table: never cut or fold it
                    console.print("    " + escape(line), soft_wrap=True, crop=False)
            if len(failed) > len(ran):
                console.print(
                    f"  {len(failed) - len(ran)} later tests not run: fix the first failure first"
                )
        elif waiting and hints:
            said = waiting[0].detail  # the exercise's own hint, where it was generated with one
            text = hint_text(exercise) if said.startswith(exercises.NO_HINT[:15]) else said
            console.print(f"[yellow]{exercise}[/]: not started; {escape(text)}")
        elif waiting:
            console.print(f"[yellow]{exercise}[/]: not started (--hints shows a hint)")
    if any(r.status != "passed" for r in results):
        console.print()
    console.print(table)  # last: the feedback first, where a terminal shows it, then the verdict
    total = {s: sum(kind(r) == s for r in results) for s in KINDS}
    said = [f"[{STYLE.get(s, 'dim')}]{n} {s}[/]" for s, n in total.items() if n or s in STYLE]
    console.print(", ".join(said) + " (tests; not run: after its exercise's first failure)")


KINDS = ("passed", "failed", "not run", "not started")


def kind(r: Result) -> str:
    """A test's column: a test not run after its exercise's first failure is no failure of its
    own (it still earns nothing)."""
    return "not run" if r.status == "failed" and r.detail.startswith(NOT_RUN) else r.status


def hint_text(exercise: str) -> str:
    """'hint: ...' (one part) or 'hints: part 1: ...; part 2: ...', from solutions/."""
    found = [h for h in exercises.hints(exercise) if h]
    if not found:
        return "no hint for it"
    if len(found) == 1:
        return f"hint: {found[0]}"
    return "hints: " + "; ".join(f"part {i}: {h}" for i, h in enumerate(found, 1))


def document(results: list[Result], fmt: str, points_path) -> str:
    """The results as text in `fmt`: json (a list of results), gradescope or junit."""
    if fmt in ("text", "json"):
        return json.dumps([asdict(r) for r in results], indent=1)
    points = gradebook.points_table(points_path)
    if fmt == "gradescope":
        seen = gradebook.visibility_table(points_path)
        return json.dumps(gradebook.gradescope(results, points, seen), indent=1)
    return gradebook.junit(results, points)


def main(args) -> int:
    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    console, err = Console(highlight=False), Console(stderr=True, highlight=False)
    if args.solutions and args.impl:
        err.print("[bold red]minipar grade:[/] --solutions and --impl DIR: choose one")
        return 2
    impl = "solutions" if args.solutions else (args.impl or "exercises")
    points = Path(args.points) if args.points else exercises.tree("solutions") / "points.toml"
    if args.submissions or args.out:
        return _class(args, points, err)
    try:
        if args.points and not points.exists():
            raise FileNotFoundError(f"no points table {points}")
        gradebook.points_table(points)  # a bad table fails before the tests run
        if args.nodes is not None and args.nodes < 1:
            raise ValueError(f"--nodes {args.nodes}: the number of nodes must be 1 or more")
        hide = (str(Path(args.output).resolve()),) if args.output else ()
        hide += tuple(filter(None, os.environ.get(batch.HIDE_ALSO_ENV, "").split(os.pathsep)))
        secret = Path(args.hidden_tests) if args.hidden_tests else None
        results = run(impl, args.lesson, verbose=args.verbose, nodes=args.nodes, hide=hide,
                      hidden_tests=secret)  # fmt: skip
    except (FileNotFoundError, ValueError, EmulationError) as error:
        err.print(f"[bold red]minipar grade:[/] {error}")
        return _stopped(args, points, f"{error}", 2)
    except KeyboardInterrupt as error:  # Ctrl-C, or stop.Terminated: SIGTERM, SIGHUP
        signum = getattr(error, "signum", signal.SIGINT)
        err.print(f"[bold red]minipar grade:[/] stopped by {signal.Signals(signum).name}")
        return _stopped(args, points, f"stopped by {signal.Signals(signum).name}", 128 + signum)
    except Exception as error:  # noqa: BLE001 - the results file is written whatever happened
        err.print(f"[bold red]minipar grade:[/] stopped: {type(error).__name__}: {error}")
        return _stopped(args, points, f"{type(error).__name__}: {error}", 1)
    if not results:
        err.print("[bold red]minipar grade:[/] no tests ran (is the lesson number right?)")
        return _stopped(args, points, "no tests ran", 2)
    if not args.solutions and (args.output or args.format in ("gradescope", "junit")):
        results += unsubmitted(results, points, args.lesson)  # a course's record
    shown = results  # what a student sees on a course platform: hints only on request
    if args.format in ("gradescope", "junit"):
        shown = [
            replace(r, detail=hint_text(r.exercise) if args.hints else "")
            if r.status == "not started"
            else r
            for r in results
        ]
    if args.output is None and args.format in ("gradescope", "junit"):
        print(document(shown, args.format, points))
    else:
        report(console, results, str(exercises.tree(impl)), hints=args.hints)
    if args.output:
        Path(args.output).write_text(document(shown, args.format, points))
    return 0 if all(r.status == "passed" for r in results) else 1


def _class(args, points: Path, err) -> int:
    """--submissions DIR --out OUT: the class, graded (course/batch.py)."""
    if not (args.submissions and args.out):
        err.print("[bold red]minipar grade:[/] --submissions DIR and --out OUT go together")
        return 2
    if args.jobs < 1 or args.timeout <= 0:
        err.print(f"[bold red]minipar grade:[/] --jobs {args.jobs} --timeout {args.timeout:g}: "
                  "--jobs must be 1 or more and --timeout above 0")  # fmt: skip
        return 2
    try:
        with stop.signals_raise(once=True):  # SIGTERM, SIGHUP: every grader stops, cleanly
            graded = batch.grade_all(
                Path(args.submissions), Path(args.out), args.jobs, args.timeout,
                Path(args.roster) if args.roster else None, points,
                say=lambda line: print(line, file=sys.stderr, flush=True),
                hidden_tests=Path(args.hidden_tests) if args.hidden_tests else None,
            )  # fmt: skip
    except (FileNotFoundError, ValueError) as error:
        err.print(f"[bold red]minipar grade:[/] {error}")
        return 2
    except KeyboardInterrupt as error:  # Ctrl-C, or stop.Terminated: SIGTERM, SIGHUP
        signum = getattr(error, "signum", signal.SIGINT)
        err.print(f"[bold red]minipar grade:[/] stopped by {signal.Signals(signum).name}: the "
                  f"graded submissions' results are in {args.out}, no grades.csv")  # fmt: skip
        return 128 + signum
    full = all(all(t["status"] == "passed" for t in g.get("tests", [])) for g in graded.values())
    return 0 if full else 1


def unsubmitted(results: list[Result], points, lesson: str | None) -> list[Result]:
    """A failed result for each exercise of the assignment (the points table's, else every
    one; a lesson's only, when one is named) that nothing was graded for: the maximum is the
    assignment's, not what was submitted."""
    table = gradebook.points_table(points)[1]
    assignment = list(table) or [p.stem for p in exercises.sources()]
    if lesson:
        assignment = [n for n in assignment if n in (selection(lesson, "solutions", Path()) or [])]
    graded = {r.exercise for r in results}
    return [
        Result(name, "submitted", "failed", f"no {name}.py in the submission")
        for name in assignment
        if name not in graded
    ]


def _stopped(args, points, why: str, status: int) -> int:
    """The grader could not grade: still a results file (every exercise of the assignment at
    0, saying why) where one was asked for, and a non-zero status."""
    if args.output:
        table = gradebook.points_table(points)[1] if Path(points).exists() else {}
        names = list(table) or [p.stem for p in exercises.sources()] or ["?"]
        failed = [Result(n, "grading", "failed", f"not graded: {why}") for n in names]
        Path(args.output).write_text(document(failed, args.format, points))
    return status


if __name__ == "__main__":
    import argparse

    _parser = argparse.ArgumentParser(prog="minipar grade")
    configure(_parser)
    raise SystemExit(main(_parser.parse_args()))
