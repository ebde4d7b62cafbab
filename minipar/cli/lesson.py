"""`minipar lesson`: list the lessons, run one under the launcher, or print its text.

    minipar lesson list                     number, title, ranks, what it shows, status
    minipar lesson 03                       minipar.course.lessons.l03_ring_and_tree on 4 ranks
    minipar lesson 03 -n 8 --quick          more ranks, the short version
    minipar lesson 03 --break wrong-chunk   the lesson's break-it lab
    minipar lesson 03 --read                the lesson's text (lessons/03_ring_and_tree.md)
    minipar lesson 03 --json claims.json    its claim records: predicted, measured, verdict

`tour_steps()` gives `minipar tour` the short version of every lesson that exists.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from minipar import launcher
from minipar.course.lessons import LESSONS, LessonInfo, find
from minipar.launcher.cluster import link as links
from minipar.launcher.cluster.job import emulated
from minipar.launcher.cluster.nodes import EmulationError

EXAMPLES = """\
examples:
  minipar lesson list                     the lessons and what each shows
  minipar lesson 01                       run lesson 01 on its default number of ranks
  minipar lesson 02 -n 8                  on 8 ranks
  minipar lesson 03 --quick               the short version (what the tour runs)
  minipar lesson 03 --break wrong-chunk   a planted bug and the check that catches it
  minipar lesson 04 --read                print the lesson's text
  minipar lesson 04 --quick --json c.json its claims (predicted, measured, tolerance, verdict,
                                          cause) as JSON; lessons/README.md reads a verdict
"""


def text_path(lesson: LessonInfo) -> Path:
    """lessons/NN_name.md in the current folder if it is there, else in the checkout minipar was
    installed from (pip install -e .)."""
    here = Path.cwd() / lesson.text
    return here if here.is_file() else Path(__file__).resolve().parents[2] / lesson.text


def exists(lesson: LessonInfo) -> bool:
    try:
        return importlib.util.find_spec(lesson.module) is not None
    except (ImportError, ValueError):
        return False


def status(lesson: LessonInfo) -> str:
    if not exists(lesson):
        return "planned"
    return "ready" if text_path(lesson).exists() else "ready (text not found)"


def run_lesson(
    key: str,
    n: int | None = None,
    quick: bool = False,
    lab: str | None = None,
    timeout: float | None = None,
    capture: bool = False,
    nodes: int | None = None,
    link: str = "2gbit",
    json: str | None = None,
):
    """Run a lesson's module under the launcher (on `nodes` emulated nodes when given: 2 ranks
    a node unless n says otherwise); returns the CompletedProcess. json: a file for the claim
    records."""
    lesson = find(key)
    if not exists(lesson):
        raise ValueError(f"lesson {lesson.number} ({lesson.title}) is not written yet")
    if lab is not None and lab not in lesson.breaks:
        labs = ", ".join(lesson.breaks) or "none"
        raise ValueError(f"lesson {lesson.number} has no lab {lab!r} (its labs: {labs})")
    argv = [
        "-m",
        lesson.module,
        *(["--quick"] if quick else []),
        *(["--break", lab] if lab else []),
        *(["--json", os.path.abspath(json)] if json else []),
    ]
    if nodes is None:
        return _run(n or lesson.ranks, argv, None, timeout, capture)
    with emulated(nodes, link) as cluster:
        return _run(n or max(lesson.ranks, 2 * nodes), argv, cluster, timeout, capture)


def _run(n, argv, cluster, timeout, capture):
    before = os.getloadavg()[0]  # the machine's load before the lesson's ranks add theirs
    cmd, env = launcher.command(n, argv, cluster=cluster)
    env.setdefault("MINIPAR_LOAD_BEFORE", f"{before:.2f}")  # unless the caller measured it
    if cluster is not None:
        rate = links.describe(cluster.rate)
        print(f"minipar lesson: {cluster.n_nodes} emulated nodes joined by a {rate} link")
    if sys.stdout.isatty() and not capture:  # ranks print through a pipe: keep colour and width
        env.setdefault("FORCE_COLOR", "1")
        env.setdefault("COLUMNS", str(shutil.get_terminal_size().columns))
    return launcher.run_command(cmd, env, timeout, capture)


def tour_steps() -> list:
    """(title, callable) per lesson that exists; each callable runs the lesson's --quick version
    on its default ranks and returns the exit status."""
    steps = []
    for lesson in LESSONS:
        if exists(lesson):

            def step(number=lesson.number) -> int:
                return run_lesson(number, quick=True, timeout=300).returncode

            steps.append((f"Lesson {lesson.number}: {lesson.title}", step))
    return steps


# -- the command ---------------------------------------------------------------------------------


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    parser.add_argument(
        "which",
        nargs="?",
        default="list",
        metavar="NN|list",
        help="a lesson number (01, 2, ...) or 'list' (the default)",
    )
    parser.add_argument(
        "-n",
        "--np",
        dest="n",
        type=int,
        default=None,
        metavar="N",
        help="number of ranks (default: the lesson's own)",
    )
    parser.add_argument("--quick", action="store_true", help="the short version")
    parser.add_argument(
        "--break",
        dest="lab",
        default=None,
        metavar="LAB",
        help="run the lesson's break-it lab LAB instead (see `list`)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="on N emulated nodes (docs/cluster.md): lessons 01, 04, 05, 08, 09 measure the link",
    )
    parser.add_argument(
        "--link", default="2gbit", metavar="RATE", help="the emulated link (default 2gbit)"
    )
    parser.add_argument("--read", action="store_true", help="print the lesson's text")
    parser.add_argument(
        "--json",
        default=None,
        metavar="FILE",
        help="write the lesson's claim records (predicted, measured, tolerance, verdict, cause)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="kill the lesson's job after S seconds (exit 124)",
    )


def list_lessons(console) -> None:
    from rich import box
    from rich.table import Table

    table = Table(title="minipar lessons", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("lesson: what it shows", ratio=1)
    table.add_column("ranks", justify="right")
    table.add_column("labs (--break)")
    table.add_column("status", no_wrap=True)
    for lesson in LESSONS:
        state = status(lesson)
        style = "green" if state == "ready" else ("dim" if state == "planned" else "yellow")
        table.add_row(
            lesson.number,
            f"[bold]{lesson.title}[/]\n[dim]{lesson.shows}[/]",
            str(lesson.ranks),
            "\n".join(lesson.breaks),
            f"[{style}]{state}[/]",
        )
    console.print(table)
    console.print("Run one: minipar lesson 01    Read one: minipar lesson 01 --read")


def main(args) -> int:
    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    console, err = Console(highlight=False), Console(stderr=True, highlight=False)
    if args.which == "list":
        list_lessons(console)
        return 0
    try:
        lesson = find(args.which)
        if args.read:
            from rich.markdown import Markdown

            path = text_path(lesson)
            if not path.exists():
                raise ValueError(f"{lesson.text} is not here (read it in the repository)")
            console.print(Markdown(path.read_text()))
            return 0
        done = run_lesson(
            args.which,
            args.n,
            args.quick,
            args.lab,
            args.timeout,
            nodes=args.nodes,
            link=args.link,
            json=getattr(args, "json", None),
        )
    except (ValueError, FileNotFoundError, EmulationError) as error:
        err.print(f"[bold red]minipar lesson:[/] {error}")
        return 2
    if done.returncode == 124 and args.timeout is not None:
        err.print(f"[bold red]minipar lesson:[/] killed after {args.timeout:g} s (--timeout)")
    return done.returncode


if __name__ == "__main__":
    import argparse

    _parser = argparse.ArgumentParser(prog="minipar lesson")
    configure(_parser)
    raise SystemExit(main(_parser.parse_args()))
