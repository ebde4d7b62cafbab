"""The `minipar` command: one entry point, one module per subcommand.

    minipar run -n 4 script.py        minipar doctor        minipar tour
    minipar lesson 03                 minipar bench         minipar grade

Each subcommand lives in its own module, which exposes `configure(parser)` (adds its arguments,
sets `parser.epilog` to a few examples) and `main(args) -> int` (the exit status). Only the module
of the command being run is imported, so `minipar --help` stays fast (no torch, no MPI), and a
command whose module is missing or broken never stops the others from working.

This package is the face: minipar/cli/NAME.py is the command NAME, calling the library below it
(launcher, planner, models, bench's measuring code, ...). Nothing outside minipar/cli/ imports it
(tests/test_cli.py checks), so the library stands apart from its command line.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

import minipar
from minipar.errors import MPISetupError

# name -> (module, one-line summary); the order is the order of `minipar --help`
COMMANDS = {
    "run": ("minipar.cli.run", "run a script, module or any program on N ranks under mpiexec"),
    "doctor": ("minipar.cli.doctor", "check MPI, torch and CUDA, and run a 2-rank smoke job"),
    "calibrate": ("minipar.cli.calibrate", "measure this machine for the lessons' predictions"),
    "tour": ("minipar.cli.tour", "the guided demo: ping-pong, ring shift, collectives, lessons"),
    "lesson": ("minipar.cli.lesson", "run one lesson and print what moved where"),
    "bench": ("minipar.cli.bench", "time the collectives' algorithms against the cost model"),
    "exercises": ("minipar.cli.exercises", "list, build or check the student exercises"),
    "course": ("minipar.cli.course", "hand a course out: the student edition (instructors)"),
    "grade": ("minipar.cli.grade", "grade the exercises with the lessons' tests"),
    "train": ("minipar.cli.train", "train a tiny model with data, tensor and pipeline parallelism"),
    "plan": ("minipar.cli.plan", "plan a parallel layout for a model on a cluster"),
    "simulate": ("minipar.cli.simulate", "collectives on a simulated cluster of 1000s of ranks"),
    "cluster": ("minipar.cli.cluster", "emulated nodes that stay up: up, shell, status, down"),
}

DESCRIPTION = """\
minipar: a from-scratch, educational distributed-training runtime.
Hand-written collectives on MPI point-to-point messages, checked against MPI and
torch.distributed; data, tensor and pipeline parallelism built on top of them."""

EPILOG = """\
examples:
  minipar tour                      the guided demo (start here)
  minipar doctor                    is MPI/torch/CUDA set up? can 2 ranks talk?
  minipar run -n 4 script.py        run script.py on 4 ranks
  minipar run -n 4 -m mymodule      run a module on 4 ranks
  minipar run -n 4 python script.py   the mpiexec habit: any program (--tag-output: [rank0]:)
  minipar COMMAND --help            the options and examples of one command
"""


def available(name: str) -> bool:
    """Whether the command's module is installed (found without importing it)."""
    try:
        return importlib.util.find_spec(COMMANDS[name][0]) is not None
    except (ImportError, ValueError):
        return False


def _selected(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first argument not starting with '-')."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


class _CommandParser(argparse.ArgumentParser):
    """A command's parser whose errors take two lines, the one that matters first (argparse
    prints the whole usage before it: 18 lines for `minipar train`)."""

    def error(self, message: str):
        message = message.removeprefix("argument ")
        self.exit(2, f"{self.prog}: {message}\n({self.prog} --help lists every option)\n")


def build_parser(selected: str | None = None):
    """The parser; only the `selected` command's module is imported to configure its parser."""
    parser = argparse.ArgumentParser(
        prog="minipar",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"minipar {minipar.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    for name, (module_name, summary) in COMMANDS.items():
        if name != selected and not available(name):
            continue
        child = sub.add_parser(
            name,
            help=summary,
            description=summary,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name == selected:
            module = importlib.import_module(module_name)
            module.configure(child)
            if not child.epilog and getattr(module, "EXAMPLES", None):
                child.epilog = module.EXAMPLES
            child.set_defaults(_main=module.main)
    return parser


def _fail(message: str) -> int:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]minipar:[/] {message}", highlight=False)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = _selected(argv)
    if selected in COMMANDS and not available(selected):
        module_name = COMMANDS[selected][0]
        return _fail(
            f"the '{selected}' command is not available in this installation "
            f"(its module {module_name} is missing)"
        )
    try:
        parser = build_parser(selected if selected in COMMANDS else None)
    except Exception as error:  # a broken command module must say so, not crash with a trace
        module_name = COMMANDS[selected][0]
        return _fail(f"cannot load the '{selected}' command from {module_name}: {error!r}")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0

    try:
        status = args._main(args)
    except KeyboardInterrupt:
        return 130
    except MPISetupError as error:  # no MPI library, say, for a command that needs one
        return _fail(str(error))
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
