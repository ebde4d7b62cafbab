"""`minipar course`: what an instructor runs to hand a course out and grade it.

    minipar course handout DIR                     the student edition, every exercise assigned
    minipar course handout DIR --exercises 03,07   only these lessons' exercises (or by name)
    minipar course autograder OUT.zip              Gradescope's bundle (course/autograder.py)

The hand-out (minipar/course/handout.py) holds the package students install (`pip install -e
DIR`), their exercises, the lessons and the docs, and none of the worked answers: where the
library's answer to an assigned exercise stood, it calls the student's exercise. docs/course.md
says how a class is graded from it.
"""

from __future__ import annotations

from pathlib import Path

from minipar.course import autograder, handout

EXAMPLES = """\
examples:
  minipar course handout ../handout              every exercise assigned
  minipar course handout ../handout --exercises 03,05,ex07_one_f_one_b
  minipar course autograder autograder.zip --points my_points.toml
"""


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    handout = sub.add_parser("handout", help="write the student edition into a new folder",
                             epilog=EXAMPLES)  # fmt: skip
    handout.add_argument("dir", metavar="DIR", help="a new (or empty) folder")
    handout.add_argument("--exercises", default=None, metavar="LIST",
                         help="lessons (03) or exercises (ex07_one_f_one_b), comma-separated; "
                         "default: every one")  # fmt: skip
    bundle = sub.add_parser("autograder", help="write Gradescope's autograder zip",
                            epilog=EXAMPLES)  # fmt: skip
    bundle.add_argument("zip", metavar="OUT.zip", help="the zip to write")
    bundle.add_argument(
        "--points",
        default=None,
        metavar="TOML",
        help="the assignment's points table (default: solutions/points.toml)",
    )


def main(args) -> int:
    from minipar.term import Console  # rich: only when a command runs

    err = Console(stderr=True, highlight=False)
    if args.action == "handout":
        try:
            made = handout.build(Path(args.dir), args.exercises)
        except (ValueError, FileNotFoundError) as error:
            err.print(f"[bold red]minipar course handout:[/] {error}")
            return 2
        cut = sorted({f for files in made["cut"].values() for f in files})
        print(f"wrote the student edition to {args.dir}: {len(made['exercises'])} exercises "
              f"assigned, their answers cut from {len(cut)} library files")  # fmt: skip
        print(f"students install it with: pip install -e {args.dir}")
        return 0
    if args.action == "autograder":
        points = Path(args.points) if args.points else None
        if points is not None and not points.exists():
            err.print(f"[bold red]minipar course autograder:[/] no points table {points}")
            return 2
        names = autograder.build(Path(args.zip), points)
        print(f"wrote {args.zip} ({len(names)} files): upload it as the assignment's autograder "
              "(Gradescope: Configure Autograder, zip file upload)")  # fmt: skip
        return 0
    return 2
