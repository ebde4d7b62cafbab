"""`minipar exercises`: list the student exercises, or generate or check exercises/.

    minipar exercises                 each exercise, its lesson, and how far exercises/ has got
    minipar exercises --generate      rewrite exercises/ from solutions/ (instructors)
    minipar exercises --check         exit 1 if exercises/ is not what --generate would write

How an exercise is made from its solution is minipar/course/exercises.py's, and `register()`
that plugs a student's algorithms into minipar is minipar/exercises.py's (the ranks being graded
use it); this is the command's face.
"""

from __future__ import annotations

from minipar.course.exercises import generate, generated, lesson_of, remaining, sources, stale, tree

EXAMPLES = """\
examples:
  minipar exercises                  the exercises and how many parts are left in each
  minipar exercises --generate       instructors: rebuild exercises/ from solutions/
  minipar exercises --generate --hints      the same, each NotImplementedError with its hint
  minipar exercises --generate --no-hints   without them (the default)
  minipar exercises --check          exit 1 if exercises/ is out of date (CI)
  minipar grade 03                   grade the lesson 03 exercises
"""


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--generate", action="store_true", help="write exercises/ from solutions/ (instructors)"
    )
    action.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if exercises/ differs from what --generate writes",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --generate: overwrite exercises a student has started",
    )
    hints = parser.add_mutually_exclusive_group()
    hints.add_argument(
        "--hints",
        action="store_true",
        help="with --generate/--check: each NotImplementedError carries its hint (the default "
        "is none: students ask `minipar grade --hints`)",
    )
    hints.add_argument("--no-hints", action="store_true", help="the default: no hints")


def main(args) -> int:
    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    console, err = Console(highlight=False), Console(stderr=True, highlight=False)
    try:
        if args.generate:
            written = generate(force=args.force, hints=args.hints)
            console.print(
                f"wrote {len(written)} file(s) in {tree('exercises')}: "
                + (", ".join(written) or "all up to date")
            )
            return 0
        if args.check:
            wrong = stale(hints=args.hints)
            if wrong:
                err.print(
                    f"[bold red]exercises/ is out of date:[/] {', '.join(wrong)}; run "
                    "`minipar exercises --generate`"
                )
                return 1
            console.print("exercises/ is up to date with solutions/")
            return 0
    except (ValueError, OSError) as error:
        err.print(f"[bold red]minipar exercises:[/] {error}")
        return 2
    show(console)
    return 0


def show(console) -> None:
    from rich import box
    from rich.table import Table

    table = Table(title="minipar exercises", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("lesson", "exercise", "parts", "left to write"):
        table.add_column(col, justify="right" if col in ("parts", "left to write") else "left")
    for path in sources():
        blocks = generated(path)[1]
        mine = tree("exercises") / path.name
        left = str(remaining(mine)) if mine.exists() else "missing"
        table.add_row(lesson_of(path), path.stem, str(blocks), left)
    console.print(table)
    console.print("Write them in exercises/, grade them with `minipar grade [NN]`.")
