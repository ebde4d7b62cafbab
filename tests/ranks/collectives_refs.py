"""Every collective x algorithm against MPI's own collective (mpi4py, uppercase calls) and
torch.distributed (gloo, brought up inside the same MPI job), on the same inputs.

Integer results and MIN/MAX must match bit for bit; floating SUM within the summation bound of
collectives.py (MPI and gloo associate the sum their own way)."""

import functools

import numpy as np
import torch
from collectives import assert_close, f64, make, values

import minipar
from minipar.collectives.reduce_op import ReduceOp

CASES = [
    ("float64", ReduceOp.SUM),
    ("float32", ReduceOp.MAX),
    ("int32", ReduceOp.SUM),
    ("int64", ReduceOp.PRODUCT),
]


@functools.cache
def gloo():
    import torch.distributed as dist
    from mpi4py import MPI

    from minipar.comm.transport.torch import init_from_mpi

    if not dist.is_initialized():
        init_from_mpi(MPI.COMM_WORLD)
    return dist


def mpi_op(op):
    from mpi4py import MPI

    return {ReduceOp.SUM: MPI.SUM, ReduceOp.MAX: MPI.MAX, ReduceOp.PRODUCT: MPI.PROD}[op]


def torch_op(op):
    dist = gloo()
    return {
        ReduceOp.SUM: dist.ReduceOp.SUM,
        ReduceOp.MAX: dist.ReduceOp.MAX,
        ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
    }[op]


def against(reference, collective, algorithm):
    """reference: "mpi" or "torch". Runs minipar and the reference on identical inputs."""

    def case():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        w = minipar.init()
        p, r = w.size, w.rank
        kind = "numpy" if reference == "mpi" else "torch"
        for dtype, op in CASES:
            for n in (1, 5, 1031):
                what = f"{collective}/{algorithm} vs {reference} {dtype} {op.name} n={n}"
                root = p - 1
                full = p * n if collective in ("reduce_scatter", "all_to_all", "scatter") else n
                mine = make(kind, dtype, values(r, full, dtype, op))
                parts = [make(kind, dtype, values(q, full, dtype, op)) for q in range(p)]
                ours = run_minipar(collective, algorithm, mine, op, root, p, r)
                ref = run_reference(reference, comm, collective, mine, op, root, p, r)
                if ours is None:
                    continue  # not the root: nothing to compare
                if collective in ("all_reduce", "reduce", "reduce_scatter"):
                    lo, hi = (r * n, (r + 1) * n) if collective == "reduce_scatter" else (0, n)
                    assert_close(ours, f64(ref), [f64(x)[lo:hi] for x in parts], dtype, op, what)
                else:
                    assert np.array_equal(f64(ours), f64(ref)), what

    return case


def run_minipar(collective, algorithm, mine, op, root, p, r):
    n = len(mine)
    clone = mine.copy() if isinstance(mine, np.ndarray) else mine.clone()
    like = lambda m: clone[:m] * 0  # noqa: E731  same kind and dtype, m elements
    if collective == "all_reduce":
        minipar.all_reduce(clone, op=op, algorithm=algorithm)
        return clone
    if collective == "reduce":
        minipar.reduce(clone, root, op=op, algorithm=algorithm)
        return clone if r == root else None
    if collective == "broadcast":
        minipar.broadcast(clone, root, algorithm=algorithm)
        return clone
    if collective == "all_gather":
        out = concat([clone] * p)
        minipar.all_gather_into_tensor(out, clone, algorithm=algorithm)
        return out
    if collective == "reduce_scatter":
        out = like(n // p)
        minipar.reduce_scatter_tensor(out, clone, op=op, algorithm=algorithm)
        return out
    if collective == "all_to_all":
        out = like(n)
        minipar.all_to_all_single(out, clone, algorithm=algorithm)
        return out
    if collective == "scatter":
        out = like(n // p)
        pieces = [clone[q * (n // p) : (q + 1) * (n // p)] for q in range(p)]
        minipar.scatter(out, pieces if r == root else None, root, algorithm=algorithm)
        return out
    if collective == "gather":
        outs = [like(n) for _ in range(p)] if r == root else None
        minipar.gather(clone, outs, root, algorithm=algorithm)
        return concat(outs) if r == root else None
    raise AssertionError(collective)


def concat(xs):
    return np.concatenate(xs) if isinstance(xs[0], np.ndarray) else torch.cat(xs)


def run_reference(reference, comm, collective, mine, op, root, p, r):
    if reference == "mpi":
        return run_mpi(comm, collective, mine, op, root, p, r)
    return run_torch(collective, mine, op, root, p, r)


def run_mpi(comm, collective, mine, op, root, p, r):
    from mpi4py import MPI

    n = len(mine)
    if collective == "all_reduce":
        out = np.empty_like(mine)
        comm.Allreduce(mine, out, op=mpi_op(op))
    elif collective == "reduce":
        out = np.empty_like(mine)
        comm.Reduce(mine, out, op=mpi_op(op), root=root)
    elif collective == "broadcast":
        out = mine.copy()
        comm.Bcast(out, root=root)
    elif collective == "all_gather":
        out = np.empty(p * n, mine.dtype)
        comm.Allgather(mine, out)
    elif collective == "reduce_scatter":
        out = np.empty(n // p, mine.dtype)
        comm.Reduce_scatter_block(mine, out, op=mpi_op(op))
    elif collective == "all_to_all":
        out = np.empty_like(mine)
        comm.Alltoall(mine, out)
    elif collective == "scatter":
        out = np.empty(n // p, mine.dtype)
        comm.Scatter(mine if r == root else None, out, root=root)
    else:
        out = np.empty(p * n, mine.dtype) if r == root else None
        comm.Gather(mine, out, root=root)
    del MPI
    return out


def run_torch(collective, mine, op, root, p, r):
    dist = gloo()
    n = len(mine)
    out = mine.clone()
    if collective == "all_reduce":
        dist.all_reduce(out, op=torch_op(op))
    elif collective == "reduce":
        dist.reduce(out, root, op=torch_op(op))
    elif collective == "broadcast":
        dist.broadcast(out, root)
    elif collective == "all_gather":
        out = mine.new_empty(p * n)
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, mine)
    elif collective == "reduce_scatter":
        out = mine.new_empty(n // p)
        reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        reduce_scatter(out, mine, op=torch_op(op))
    elif collective == "all_to_all":
        out = mine.new_empty(n)
        dist.all_to_all_single(out, mine)
    elif collective == "scatter":
        out = mine.new_empty(n // p)
        pieces = list(mine.chunk(p)) if r == root else None
        dist.scatter(out, pieces, src=root)
    else:
        outs = [mine.new_empty(n) for _ in range(p)] if r == root else None
        dist.gather(mine, outs, dst=root)
        out = torch.cat(outs) if r == root else None
    return out


COLLECTIVES = [
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "scatter",
    "gather",
]


def cases(size):
    table = {}
    for collective in COLLECTIVES:
        for algorithm in minipar.algorithms(collective)[1:]:
            for reference in ("mpi", "torch"):
                table[f"{collective}.{algorithm}.vs_{reference}"] = against(
                    reference, collective, algorithm
                )
    return table
