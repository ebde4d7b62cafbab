"""`minipar bench`: minipar's collectives timed beside MPI's and gloo's, predicted by the cost
model, and measured against this machine's roofline.

    minipar bench all_reduce -n 2 --against mpi,torch --json out.json

command.py  the command: arguments, launching the job, progress, output
ranks.py    what every rank runs: the sweep, phase by phase
ops.py      one call of each implementation; timing.py how a cell is timed
fit.py      --fit: alpha, beta, gamma of this machine; report.py, table.py, plot.py the output
spec.py     sizes, collectives, bandwidth factors
"""

from __future__ import annotations


def configure(parser) -> None:
    from minipar.bench.command import configure as _configure

    _configure(parser)


def main(args) -> int:
    from minipar.bench.command import main as _main

    return _main(args)
