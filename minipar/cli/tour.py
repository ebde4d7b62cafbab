"""`minipar tour`: the guided demo, on whatever MPI this machine has (the mpich wheel by default).

The tour is a list of steps run in order. The first ones are minipar's own:

    doctor       is MPI, torch and CUDA set up; can two ranks talk?
    ping-pong    latency and bandwidth between two ranks        (course/demos/ping_pong.py, 2)
    ring-shift   who sends what to whom in a ring                (course/demos/ring_shift.py, 4)
    all-reduce   every all-reduce algorithm: ledger vs cost model (course/demos/all_reduce.py, 4)

Then the short version of each lesson, from `minipar.cli.lesson.tour_steps()`.
That function returns a list whose items are any of:

    Step(name, title, run, text)     run(tour) -> status (this module's own kind of step)
    (title, callable)                callable() or callable(quick=...) -> status
    (title, ["minipar", "lesson", "01", "--quick"])   a command line, run as a subprocess
    callable                         titled by the first line of its docstring

A status of None, True or 0 means the step passed; False, a non-zero int or an exception means it
failed. A failed step does not stop the tour (a failed doctor does); the exit status is 0 only
when every step passed. Rank-side code runs under `minipar run`, so each step can be replayed
alone with the command the tour prints.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from minipar import launcher
from minipar.cli import doctor, lesson
from minipar.launcher.cluster import needs

EXAMPLES = """\
examples:
  minipar tour                    every step, lessons included (a line after each: its time)
  minipar tour --quick            fewer sizes and repetitions
  minipar tour --no-lessons       only minipar's own steps (doctor, ping-pong, ring, all-reduce)
  minipar tour --only ring-shift  one step (see --list for the names)
  minipar tour --list             the steps, without running them
"""


@dataclass
class Step:
    name: str
    title: str
    run: Callable  # run(tour) -> status
    text: str = ""  # a few lines saying what the step shows
    fatal: bool = False  # stop the tour when this step fails


@dataclass
class Tour:
    quick: bool = False
    timeout: float = 120.0
    console: object = None
    results: list = field(default_factory=list)  # (step name, passed, seconds)
    began: float = field(default_factory=time.perf_counter)  # the tour's start, for progress

    def demo(self, ranks: int, module: str, *args: str) -> int:
        """Run a rank-side demo module on `ranks` ranks; its output streams through."""
        argv = ["-m", module, *args, *(["--quick"] if self.quick and _takes_quick(module) else [])]
        shown = " ".join(["minipar run -n", str(ranks), *argv])
        self.console.print(f"[dim]$ {shown}[/]")
        sys.stdout.flush()
        return launcher.run(ranks, argv, timeout=self.timeout).returncode


def _takes_quick(module: str) -> bool:
    return module.rsplit(".", 1)[-1] in ("ping_pong", "all_reduce")


# -- minipar's own steps ------------------------------------------------------------------------


def doctor_step(tour: Tour) -> bool:
    report = doctor.collect(smoke=True, timeout=min(tour.timeout, 60))
    tour.console.print(
        doctor.table(report, title="doctor (minipar doctor for the notes)", notes=False)
    )
    tour.console.print(doctor.verdict(report))
    return report["ok"]


CORE_STEPS = [
    Step("doctor", "What will minipar run on?", doctor_step, fatal=True, text=(
        "The MPI library mpi4py loaded, the mpiexec that belongs to it, torch and its backends, "
        "and a 2-rank smoke job: a message around a ring and a small all-reduce.")),
    Step("ping-pong", "Ping-pong: latency and bandwidth",
         lambda t: t.demo(2, "minipar.course.demos.ping_pong"), text=(
        "Two ranks bounce a buffer back and forth. Small messages cost a fixed alpha (latency); "
        "large ones approach the link's bandwidth 1/beta. Every cost in the lessons is built "
        "from these two numbers: t(n) = alpha + n * beta.")),
    Step("ring-shift", "Ring shift: who sends what to whom",
         lambda t: t.demo(4, "minipar.course.demos.ring_shift"), text=(
        "Four ranks in a ring; each passes the letter it holds to the right and receives one "
        "from the left, three times. Every link is busy in every step, and afterwards every "
        "rank has every letter: the ring all-gather.")),
    Step("all-reduce", "All-reduce: {n} algorithms, one answer",
         lambda t: t.demo(4, "minipar.course.demos.all_reduce"), text=(
        "The same sum computed {n} ways. The trace ledger counts each algorithm's steps and the "
        "bytes the busiest rank sends; the cost model predicts both, and the time. Few steps win "
        "for small vectors (latency), few bytes for large ones (bandwidth).")),
]  # fmt: skip


NUMBERS = "no one two three four five six seven eight nine ten eleven twelve".split()


def core_steps() -> list[Step]:
    """CORE_STEPS with {n}, the number of all-reduce algorithms the demo runs (every registered
    one but auto), in words: the text follows the registry instead of a count written once."""
    # here, not at the top of the file: numpy loads only when used
    from minipar.collectives import registry

    count = len([a for a in registry.algorithms("all_reduce") if a != "auto"])
    n = NUMBERS[count] if count < len(NUMBERS) else str(count)
    return [replace(s, title=s.title.format(n=n), text=s.text.format(n=n)) for s in CORE_STEPS]


# -- steps from the lessons ---------------------------------------------------------------------


def lesson_steps() -> list[Step]:
    """The lessons' short versions, from minipar.cli.lesson.tour_steps()."""
    try:
        items = list(lesson.tour_steps())
    except Exception as error:  # a broken lesson module must not take the tour down
        return [Step("lessons", "Lessons", lambda t, e=error: _raise(e))]
    return [as_step(item, i) for i, item in enumerate(items, 1)]


def _raise(error: BaseException):
    raise error


def as_step(item, index: int) -> Step:
    """Turn one item of tour_steps() into a Step (see the module docstring for the kinds)."""
    if isinstance(item, Step):
        return item
    title, what = item if isinstance(item, tuple) and len(item) == 2 else (None, item)
    if isinstance(what, (list, tuple)) and all(isinstance(a, str) for a in what):
        title = title or " ".join(what)
        return Step(f"lesson-{index}", title, lambda t: run_command(t, list(what)))
    if callable(what):
        doc = (inspect.getdoc(what) or "").strip()
        title = title or (doc.splitlines()[0] if doc else getattr(what, "__name__", "lesson"))
        return Step(f"lesson-{index}", title, lambda t: call_lesson(t, what))
    raise TypeError(f"tour step {index}: cannot run {item!r}")


def call_lesson(tour: Tour, fn: Callable):
    try:
        takes_quick = "quick" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_quick = False
    return fn(quick=tour.quick) if takes_quick else fn()


def run_command(tour: Tour, argv: list[str]) -> int:
    """A command line; `minipar ...` means this installation's minipar."""
    tour.console.print(f"[dim]$ {' '.join(argv)}[/]")
    sys.stdout.flush()
    if argv and argv[0] == "minipar":
        argv = [sys.executable, "-m", "minipar", *argv[1:]]
    try:
        return subprocess.run(argv, timeout=tour.timeout).returncode
    except subprocess.TimeoutExpired:
        tour.console.print(f"[bold red]timed out after {tour.timeout:g} s[/]")
        return 124


# -- running ------------------------------------------------------------------------------------


def passed(status) -> bool:
    return status is None or status is True or (type(status) is int and status == 0)


def run_step(tour: Tour, step: Step, number: int, total: int) -> bool:
    from rich.rule import Rule

    tour.console.print()
    tour.console.print(Rule(f"[bold]{number}/{total}  {step.title}[/]", align="left"))
    if step.text:
        tour.console.print(step.text)
    start = time.perf_counter()
    try:
        ok = passed(step.run(tour))
    except Exception as error:
        tour.console.print(f"[bold red]step {step.name} failed:[/] {error!r}")
        ok = False
    seconds = time.perf_counter() - start
    tour.results.append((step.name, ok, seconds))
    tour.console.print(progress_line(step.name, ok, seconds, number, total, tour.began))
    return ok


def progress_line(name: str, ok: bool, seconds: float, number: int, total: int, began) -> str:
    """After each step: what it took, and the tour's time so far (a slow machine shows where)."""
    verdict = "passed" if ok else "[bold red]FAILED[/]"
    elapsed = time.perf_counter() - began
    return (f"[dim]step {number}/{total} {name}:[/] {verdict} [dim]in {seconds:.1f} s; "
            f"{elapsed:.0f} s since the tour began[/]")  # fmt: skip


def summary(tour: Tour):
    from rich.table import Table

    grid = Table(title="tour summary", title_justify="left")
    for name in ("step", "result", "seconds"):
        grid.add_column(name, justify="right" if name == "seconds" else "left")
    for name, ok, seconds in tour.results:
        grid.add_row(name, "[green]passed[/]" if ok else "[bold red]FAILED[/]", f"{seconds:.1f}")
    grid.add_row("total", "", f"{sum(s for _, _, s in tour.results):.1f}", style="bold")
    return grid


def select(steps: list[Step], only) -> list[Step]:
    if not only:
        return steps
    chosen = [s for s in steps if any(s.name == o or s.name.startswith(o) for o in only)]
    if not chosen:
        raise ValueError(f"no step named {', '.join(only)}; see minipar tour --list")
    return chosen


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    parser.add_argument("--no-lessons", action="store_true", help="skip the lessons' steps")
    parser.add_argument("--only", nargs="+", metavar="STEP", help="run only these steps")
    parser.add_argument("--list", action="store_true", help="list the steps and exit")
    parser.add_argument("--timeout", type=float, default=120, metavar="S",
                        help="seconds one step's job may take (default 120)")  # fmt: skip


def main(args) -> int:
    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    console = Console(highlight=False)
    if console.is_terminal:  # the ranks' rich output then matches this terminal
        os.environ.setdefault("FORCE_COLOR", "1")
        os.environ.setdefault("COLUMNS", str(console.width))
    steps = core_steps() + ([] if args.no_lessons else lesson_steps())
    if args.list:
        for step in steps:
            console.print(f"{step.name:14} {step.title}")
        return 0
    try:
        steps = select(steps, args.only)
    except ValueError as error:
        console.print(f"[bold red]minipar tour:[/] {error}")
        return 2
    tour = Tour(quick=args.quick, timeout=args.timeout, console=console)
    for number, step in enumerate(steps, 1):
        if not run_step(tour, step, number, len(steps)) and step.fatal:
            console.print(f"[bold red]stopping the tour:[/] {step.name} failed")
            break
    console.print()
    console.print(summary(tour))
    offer_nodes(console)
    ok = len(tour.results) == len(steps) and all(ok for _, ok, _ in tour.results)
    return 0 if ok else 1


def offer_nodes(console) -> None:
    """Where this machine can emulate nodes (launcher/cluster/needs.py), say how to feel the
    slow link: the lessons that measure it on two nodes."""
    if needs.missing():
        return
    console.print(
        "\nThis machine can emulate nodes (docs/cluster.md). Feel the slow link between them: "
        "minipar lesson 01 --nodes 2 (the two links side by side), 04 (the two-level "
        "all-reduce), 08 (tensor parallelism inside against across), 09 (where ring "
        "attention hides)."
    )
