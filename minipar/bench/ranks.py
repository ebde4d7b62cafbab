"""The rank side of `minipar bench`: run by every rank of the one job the command launches.

    python -m minipar.bench.ranks SPEC.json OUT.jsonl

For each collective and size: the roofline kernels, then every cell (each minipar algorithm,
MPI's own collective, torch's with gloo brought up inside this MPI job) taking turns, each run
of calls a phase between barriers, never two at once (timing.py). Rank 0 alone appends one JSON
line per finished cell to OUT (events.py), which the launching process follows (the progress
bar) and turns into the table.
"""

from __future__ import annotations

import json
import os
import platform
import sys

import minipar
from minipar import cost, launcher
from minipar.bench import events, fit, ops, spec
from minipar.bench.timing import Timer
from minipar.cost import roofline


class Out:
    """Rank 0's JSON-lines log (events.Writer: one writer, a record one write); the other
    ranks write nothing."""

    def __init__(self, path: str, rank: int):
        self.writer = events.Writer(path) if rank == 0 else None

    def emit(self, kind: str, **fields) -> None:
        if self.writer is not None:
            self.writer.emit(kind, **fields)


def header(comm, dist) -> dict:
    from mpi4py import MPI

    # here, not at the top of the file: numpy loads only when used
    from minipar.collectives import hierarchical
    from minipar.collectives.fast import routing

    torch = sys.modules.get("torch")
    return {
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "mpi4py": sys.modules["mpi4py"].__version__,
        "torch": torch.__version__ if torch is not None else None,
        "torch_backend": dist.get_backend() if dist is not None else None,
        "python": platform.python_version(),
        "world_size": comm.size,
        "cores": launcher.cores(),
        "oversubscribed": comm.size > launcher.cores(),
        "host": platform.node(),
        "load": list(os.getloadavg()),  # other processes' load: noise in every number
        "transport": routing.describe(comm),
        "nodes": hierarchical.shape(comm),  # (nodes, ranks per node) when the job spans nodes
    }


def cells(collective: str, job: dict, nbytes: int, p: int):
    """(implementation, algorithm) pairs of one size, in the order they are timed."""
    for algorithm in job["algorithms"][collective]:
        yield "minipar", algorithm
    for impl in job["against"]:
        yield impl, "native"
    if job["against"] and ops.floor_fits(collective, nbytes, p, job["dtype"]):
        yield "floor", "native"  # bare mpi4py + numpy: what Python alone costs (ops.py)


def one_size(out, timer, ctx, job, collective: str, nbytes: int) -> None:
    """Every cell of one size: build each op (or skip it, on every rank), then time them all,
    taking turns (timing.py)."""
    # here, not at the top of the file: numpy loads only when used
    from minipar.collectives import registry
    from minipar.collectives.fast import routing

    ops_by_cell, where = {}, {"collective": collective, "nbytes": nbytes}
    for impl, algorithm in cells(collective, job, nbytes, ctx.size):
        try:
            op = ops.make(impl, collective, algorithm, nbytes, job["dtype"], ctx)
            why = f"{impl} has no {job['dtype']} {collective}"
            if op is not None and impl == "minipar" and ops.is_user(collective, algorithm):
                why = ops.wrong_answer(collective, algorithm, ctx)  # a student's: right?
                op = None if why else op
        except (ImportError, TypeError, ValueError) as error:
            op, why = None, f"{type(error).__name__}: {error}"
        if timer.max_over_ranks(1.0 if op is None else 0.0):  # every rank skips, or none
            out.emit("skip", reason=why, implementation=impl, algorithm=algorithm, **where)
        else:
            ops_by_cell[impl, algorithm] = op
    times = timer.take_turns(ops_by_cell, job["iters"], job["warmup"], job["budget"])
    for (impl, algorithm), ts in times.items():
        extra = {}
        if impl == "minipar":  # what runs: auto's pick, and the transport it goes over
            base = ops.base_algorithm(algorithm)
            chosen = registry.pick(collective, base, nbytes, ctx.size, ctx.comm)[0]
            buf = ops.probe_buffer(nbytes, job["dtype"])
            place = _window_place(ctx, collective, nbytes) if base != algorithm else None
            chosen = routing.choice(ctx.comm, collective, chosen, nbytes, buf, place)
            if chosen != algorithm:
                extra["chosen"] = chosen
        out.emit("row", implementation=impl, algorithm=algorithm, times=ts, **where, **extra)


def _window_place(ctx, collective: str, nbytes: int):
    """For routing.choice, a stand-in for a window buffer's place (it only asks whether there
    is one): the row's buffer lies in the window when the group shares memory, and the call
    reads it in place above cost.SHM_MIN_BYTES."""
    if nbytes <= cost.SHM_MIN_BYTES or not getattr(ctx.comm, "_shm_node", None):
        return None
    return collective


def sweep(out, timer, ctx, job) -> None:
    p, itemsize = ctx.size, spec.ITEMSIZE[job["dtype"]]
    kernel_dtype = job["dtype"] if job["dtype"] != "bfloat16" else "float16"
    for collective in job["collectives"]:
        for size in job["sizes"]:
            nbytes = spec.round_size(collective, size, p, itemsize)
            chunk = max(itemsize, nbytes // p)
            rates = roofline.kernel_rates(chunk, kernel_dtype, timer.barrier, timer.max_over_ranks)
            peer = ops.window_rates(ctx, chunk, kernel_dtype, timer.barrier, timer.max_over_ranks)
            out.emit(
                "roof", collective=collective, nbytes=nbytes, copy_Bps=rates[0], add_Bps=rates[1],
                **({"peer_copy_Bps": peer[0], "peer_add_Bps": peer[1]} if peer else {}),
            )  # fmt: skip
            one_size(out, timer, ctx, job, collective, nbytes)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        job = json.load(f)

    comm = minipar.init(backend="mpi")
    if job.get("impl"):  # the student's algorithms (--impl DIR), on every rank
        minipar.exercises.register(job["impl"])
    out, timer, dist = Out(argv[1], comm.rank), Timer(comm, comm.mpi), None
    if "torch" in job["against"]:
        import torch.distributed

        # here, not at the top of the file: numpy loads only when used
        from minipar.comm.transport.torch import init_from_mpi

        init_from_mpi(comm.mpi, "gloo", timeout=comm.timeout)
        dist = torch.distributed
    out.emit("header", **header(comm, dist), link=cost.default_link().name,
             link_Bps=job.get("link_Bps"))  # fmt: skip
    if job["fit"]:
        measured = fit.measure(comm, timer)
        link = fit.as_link(measured)
        cost.set_default_link(link)  # auto now prices with this machine's numbers
        # the second transport's link, if there is one (gamma: the same np.add as MPI's)
        windows = fit.measure_shm(comm, timer, measured["gamma"])
        shm_link = None
        if windows:
            measured.update(windows)
            shm_link = fit.as_shm_link(measured)
            cost.set_shm_link(shm_link)
        inter = fit.as_inter_link(measured)  # the job spans nodes: their link, fitted apart
        if inter is not None:
            cost.set_inter_link(inter)
        if comm.rank == 0:
            cost.save_link(link, job["fit_path"], **measured)
            if inter is not None:
                cost.save_link(inter, fit.inter_path(job["fit_path"]))
            if shm_link is not None:
                cost.save_link(shm_link, fit.shm_path(job["fit_path"]))
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
