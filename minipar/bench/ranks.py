"""The rank side of `minipar bench`: run by every rank of the one job the command launches.

    python -m minipar.bench.ranks SPEC.json OUT.jsonl

For each collective and size, in phases separated by barriers (never two at once): the
roofline kernels, then each minipar algorithm, then MPI's own collective, then torch's (gloo,
brought up inside this MPI job). Rank 0 appends one JSON line per finished cell to OUT, which the
launching process reads as it grows (the progress bar) and turns into the table.
"""

from __future__ import annotations

import json
import os
import platform
import sys

from minipar.bench import ops, spec
from minipar.bench.timing import Timer


class Out:
    """Rank 0's JSON-lines log; the other ranks write nothing."""

    def __init__(self, path: str, rank: int):
        self.file = open(path, "a") if rank == 0 else None  # noqa: SIM115

    def emit(self, kind: str, **fields) -> None:
        if self.file is not None:
            self.file.write(json.dumps({"type": kind, **fields}) + "\n")
            self.file.flush()


def header(comm, dist) -> dict:
    from mpi4py import MPI

    from minipar import launch

    torch = sys.modules.get("torch")
    return {
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "mpi4py": sys.modules["mpi4py"].__version__,
        "torch": torch.__version__ if torch is not None else None,
        "torch_backend": dist.get_backend() if dist is not None else None,
        "python": platform.python_version(),
        "world_size": comm.size,
        "cores": launch.cores(),
        "oversubscribed": comm.size > launch.cores(),
        "host": platform.node(),
    }


def cells(collective: str, nbytes: int, job: dict):
    """(implementation, algorithm) pairs of one size, in the order they are timed."""
    for algorithm in job["algorithms"][collective]:
        yield "minipar", algorithm
    for impl in job["against"]:
        yield impl, "native"


def run_cell(out, timer, ctx, job, collective, nbytes, impl, algorithm) -> None:
    from minipar.collectives import registry

    where = {"collective": collective, "nbytes": nbytes, "implementation": impl}
    where["algorithm"] = algorithm
    try:
        op = ops.make(impl, collective, algorithm, nbytes, job["dtype"], ctx)
    except (ImportError, TypeError, ValueError) as error:
        op, why = None, f"{type(error).__name__}: {error}"
    else:
        why = f"{impl} has no {job['dtype']} {collective}"
    if timer.max_over_ranks(1.0 if op is None else 0.0):  # every rank skips, or none
        out.emit("skip", reason=why, **where)
        return
    times = timer.cell(op, job["iters"], job["warmup"], job["budget"])
    if algorithm == "auto":
        where["chosen"] = registry.pick(collective, "auto", nbytes, ctx.size)[0]
    out.emit("row", times=times, **where)


def sweep(out, timer, ctx, job) -> None:
    from minipar import roofline

    p, itemsize = ctx.size, spec.ITEMSIZE[job["dtype"]]
    kernel_dtype = job["dtype"] if job["dtype"] != "bfloat16" else "float16"
    for collective in job["collectives"]:
        for size in job["sizes"]:
            nbytes = spec.round_size(collective, size, p, itemsize)
            chunk = max(itemsize, nbytes // p)
            copy, add = roofline.kernel_rates(
                chunk, kernel_dtype, timer.barrier, timer.max_over_ranks
            )
            out.emit("roof", collective=collective, nbytes=nbytes, copy_Bps=copy, add_Bps=add)
            for impl, algorithm in cells(collective, nbytes, job):
                run_cell(out, timer, ctx, job, collective, nbytes, impl, algorithm)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        job = json.load(f)
    import minipar
    from minipar import cost
    from minipar.bench import fit

    comm = minipar.init(backend="mpi")
    out, timer, dist = Out(argv[1], comm.rank), Timer(comm, comm.mpi), None
    if "torch" in job["against"]:
        import torch.distributed

        from minipar.comm.torch import init_from_mpi

        init_from_mpi(comm.mpi, "gloo", timeout=comm.timeout)
        dist = torch.distributed
    out.emit("header", **header(comm, dist), link=cost.default_link().name)
    if job["fit"]:
        measured = fit.measure(comm, timer)
        link = fit.as_link(measured)
        cost.set_default_link(link)  # auto now prices with this machine's numbers
        if comm.rank == 0:
            cost.save_link(link, job["fit_path"], **measured)
        out.emit("fit", path=job["fit_path"], **measured)
    sweep(out, timer, ops.Context(comm, comm.mpi, dist), job)
    timer.barrier()
    out.emit("done")
    if dist is not None:
        dist.destroy_process_group()
    minipar.finalize()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
