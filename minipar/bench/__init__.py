"""`minipar bench`'s measuring code: minipar's collectives timed beside MPI's and gloo's, predicted
by the cost model, and measured against this machine's roofline.

    minipar bench all_reduce -n 2 --against mpi,torch --json out.json

ranks.py    what every rank runs: the sweep, phase by phase
ops.py      one call of each implementation; timing.py how a cell is timed
fit.py      --fit: alpha, beta, gamma of this machine; report.py, table.py, plot.py the output
spec.py     sizes, collectives, bandwidth factors
ddp.py, tp.py, pipeline.py   the training-step benches (bench ddp, tp, pp), each its own job

The command (arguments, launching the job, progress, output) is minipar/cli/bench.py.
"""
