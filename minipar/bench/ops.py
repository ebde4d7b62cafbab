"""The operation each benchmark cell times: one collective call, by minipar, MPI or torch.

`make(impl, collective, algorithm, nbytes, dtype, ctx)` allocates the buffers once and returns a
function of no arguments that makes one call (or None when the implementation cannot run that
dtype, e.g. MPI has no bfloat16 reduction). Buffers start as zeros, so repeated in-place sums
never overflow or turn into slow denormals. Every call is in place where the API allows it, as
DDP uses all-reduce: minipar and torch are in place by design, MPI gets MPI_IN_PLACE.

A minipar algorithm named with WINDOW's suffix ("ring+window") runs on buffers from
`minipar.empty`, which live in the node's shared window: a buffer a user (or DDP, or FSDP) owns
there, reduced where it lies.
"""

from __future__ import annotations

import minipar
from minipar.bench.spec import ITEMSIZE
from minipar.cost import roofline


class Context:
    """What the ops need from the job: the minipar group, mpi4py's communicator, torch.dist."""

    def __init__(self, comm, mpi_comm, dist=None):
        self.comm, self.mpi, self.dist = comm, mpi_comm, dist
        self.rank, self.size = comm.rank, comm.size


def _numpy_dtype(dtype: str):
    import numpy as np

    return None if dtype == "bfloat16" else np.dtype(dtype)


def _buffer(count: int, dtype: str, torch_tensor: bool = False):
    """Zeros: numpy when numpy has the dtype (and torch was not asked for), else torch."""
    if not torch_tensor and _numpy_dtype(dtype) is not None:
        import numpy as np

        return np.zeros(count, _numpy_dtype(dtype))
    import torch

    return torch.zeros(count, dtype=getattr(torch, dtype))


def make(impl: str, collective: str, algorithm: str, nbytes: int, dtype: str, ctx: Context):
    count = nbytes // ITEMSIZE[dtype]
    block = count // ctx.size
    if impl == "minipar":
        return _minipar(collective, algorithm, count, block, dtype, ctx)
    if impl == "mpi":
        return _mpi(collective, count, block, dtype, ctx)
    if impl == "torch":
        return _torch(collective, count, block, dtype, ctx)
    if impl == "floor":
        return _floor(collective, count, dtype, ctx)
    raise ValueError(f"unknown implementation {impl!r}")


FLOOR_BYTES = 64 << 10  # the python floor row is about call overhead: small messages only
WINDOW = "+window"  # "ring+window": the ring on buffers that live in the shared window


def window_variants(collective: str) -> list[str]:
    """The bench's rows of buffers in the window (the in-place schedules' collectives)."""
    return ["ring" + WINDOW] if collective in ("all_reduce", "all_gather", "reduce_scatter") else []


def base_algorithm(algorithm: str) -> str:
    """The algorithm a cell passes to minipar ("ring+window" -> "ring")."""
    return algorithm.removesuffix(WINDOW)


def window_rates(ctx, nbytes: int, dtype: str, barrier, reduce_max):
    """(copy, add) bytes/s of reading a peer's freshly written window buffer of nbytes
    (cost.roofline.peer_rates; every rank reads its right neighbour's), or None when the group
    cannot share memory. Collective."""
    import numpy as np

    # here, not at the top of the file: numpy loads only when used
    from minipar.collectives.window_buffer import shared_node
    from minipar.comm.transport import shm_buffers

    node = shared_node(ctx.comm, "bench: the window roofline")
    np_dtype = _numpy_dtype(dtype)
    if node is None or np_dtype is None:
        return None
    count = max(roofline.MIN_BYTES, nbytes) // np_dtype.itemsize
    mine = minipar.empty(count, np_dtype, group=ctx.comm)
    theirs = shm_buffers.twins(node, mine)[(ctx.rank + 1) % ctx.size].view(np_dtype)
    scratch = np.zeros(count, np_dtype)
    return roofline.peer_rates(mine, theirs, scratch, barrier, reduce_max)


def probe_buffer(nbytes: int, dtype: str):
    """A one-element buffer of the bench's kind (what the transport choice looks at)."""
    return _buffer(1, dtype)


def floor_fits(collective: str, nbytes: int, p: int, dtype: str) -> bool:
    """Whether the python floor row can run: an all-reduce of a numpy dtype up to FLOOR_BYTES
    on a power-of-two number of ranks (it is recursive doubling)."""
    return (
        collective == "all_reduce"
        and _numpy_dtype(dtype) is not None
        and p & (p - 1) == 0
        and nbytes <= FLOOR_BYTES
    )


def is_user(collective: str, algorithm: str) -> bool:
    """Whether a cell's algorithm is a registered one (a student's, --impl), not minipar's."""
    # here, not at the top of the file: numpy loads only when used
    from minipar.collectives import registry

    base = base_algorithm(algorithm).partition("@")[0]
    return base != "auto" and base not in registry.BUILTIN[collective]


def wrong_answer(collective: str, algorithm: str, ctx) -> str:
    """Why a registered algorithm must not be timed, or "": one call on known values, checked
    against the sum worked out here (all-reduce) or the root's values (broadcast), agreed by
    every rank. A student's algorithm is timed only once it gives the right answer."""
    import numpy as np

    p, count = ctx.size, 8 * ctx.size
    if collective == "all_reduce":
        x = np.arange(count, dtype=np.float32) + 1000 * ctx.rank
        want = p * np.arange(count, dtype=np.float32) + 1000 * p * (p - 1) // 2
        call = lambda: minipar.all_reduce(x, algorithm=algorithm)  # noqa: E731
    elif collective == "broadcast":
        x = np.arange(count, dtype=np.float32) * (ctx.rank == 0)
        want = np.arange(count, dtype=np.float32)
        call = lambda: minipar.broadcast(x, 0, algorithm=algorithm)  # noqa: E731
    else:
        return ""
    try:
        call()
        wrong = not np.array_equal(x, want)
    except Exception as error:  # the student's code: whatever it raised is the reason
        wrong = f"{type(error).__name__}: {error}"
    said = ctx.mpi.allgather(wrong)
    first = next((w for w in said if isinstance(w, str)), None)
    if first:
        return f"{algorithm} raised {first}; minipar grade shows where"
    if any(said):
        return f"{algorithm} gives wrong values on {p} ranks; minipar grade shows where"
    return ""


def _floor(collective, count, dtype, ctx):
    """The python floor: the same all-reduce as recursive doubling, in bare mpi4py `Sendrecv`
    calls and a numpy add, with no minipar at all (no checks, no tags, no timeouts). What is
    left between this row and minipar's is what minipar's layers cost."""
    import numpy as np
    from mpi4py import MPI

    p, r, comm = ctx.size, ctx.rank, ctx.mpi
    nbytes = count * ITEMSIZE[dtype]
    if not floor_fits(collective, nbytes, p, dtype):
        raise ValueError(
            f"the python floor is an all-reduce of numpy dtypes up to {FLOOR_BYTES} bytes on a "
            "power-of-two number of ranks"
        )
    x, tmp = _buffer(count, dtype), _buffer(count, dtype)
    send, recv = [x, MPI.BYTE], [tmp, MPI.BYTE]
    peers = [r ^ (1 << k) for k in range(p.bit_length() - 1)]

    def run():
        for peer in peers:
            comm.Sendrecv(send, peer, 7, recv, peer, 7)
            np.add(x, tmp, out=x)

    return run


def _minipar(collective, algorithm, count, block, dtype, ctx):
    p, root = ctx.size, 0
    x = _buffer(count, dtype)
    small = _buffer(block, dtype)
    if algorithm.endswith(WINDOW):  # the whole buffer in the window (all-gather: the output)
        x = _window_buffer(count, dtype, ctx)
        algorithm = base_algorithm(algorithm)
    alg = {"algorithm": algorithm}
    if collective == "all_reduce":
        return lambda: minipar.all_reduce(x, **alg)
    if collective == "all_gather":
        return lambda: minipar.all_gather_into_tensor(x, small, **alg)
    if collective == "reduce_scatter":
        return lambda: minipar.reduce_scatter_tensor(small, x, **alg)
    if collective == "broadcast":
        return lambda: minipar.broadcast(x, root, **alg)
    if collective == "reduce":
        return lambda: minipar.reduce(x, root, **alg)
    if collective == "all_to_all":
        out = _buffer(count, dtype)
        return lambda: minipar.all_to_all_single(out, x, **alg)
    blocks = [_buffer(block, dtype) for _ in range(p)] if ctx.rank == root else None
    if collective == "scatter":
        return lambda: minipar.scatter(small, blocks, root, **alg)
    if collective == "gather":
        return lambda: minipar.gather(small, blocks, root, **alg)
    raise ValueError(f"no benchmark for {collective!r}")


def _window_buffer(count: int, dtype: str, ctx):
    """Zeros in the node's shared window (minipar.empty), of the bench's kind."""
    if _numpy_dtype(dtype) is not None:
        x = minipar.empty(count, _numpy_dtype(dtype), group=ctx.comm)
    else:
        import torch

        x = minipar.empty((count,), getattr(torch, dtype), group=ctx.comm)
    x[:] = 0
    return x


def _mpi(collective, count, block, dtype, ctx):
    from mpi4py import MPI

    np_dtype = _numpy_dtype(dtype)
    if np_dtype is None:
        return None  # MPI has no bfloat16
    comm, root, me = ctx.mpi, 0, ctx.rank
    x, small = _buffer(count, dtype), _buffer(block, dtype)
    if collective == "all_reduce":
        return lambda: comm.Allreduce(MPI.IN_PLACE, x)
    if collective == "all_gather":
        return lambda: comm.Allgather(small, x)
    if collective == "reduce_scatter":
        return lambda: comm.Reduce_scatter_block(x, small)
    if collective == "broadcast":
        return lambda: comm.Bcast(x, root)
    if collective == "reduce":
        return lambda: comm.Reduce(MPI.IN_PLACE if me == root else x, x, root=root)
    if collective == "all_to_all":
        out = _buffer(count, dtype)
        return lambda: comm.Alltoall(x, out)
    if collective == "scatter":
        return lambda: comm.Scatter(x, small, root)
    if collective == "gather":
        return lambda: comm.Gather(small, x, root)
    raise ValueError(f"no benchmark for {collective!r}")


def _torch(collective, count, block, dtype, ctx):
    dist, root = ctx.dist, 0
    if dist is None:
        return None
    x, small = _buffer(count, dtype, True), _buffer(block, dtype, True)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(x)
    if collective == "all_gather":
        return lambda: dist.all_gather_into_tensor(x, small)
    if collective == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(small, x)
    if collective == "broadcast":
        return lambda: dist.broadcast(x, root)
    if collective == "reduce":
        return lambda: dist.reduce(x, root)
    if collective == "all_to_all":
        out = _buffer(count, dtype, True)
        return lambda: dist.all_to_all_single(out, x)
    blocks = [_buffer(block, dtype, True) for _ in range(ctx.size)] if ctx.rank == root else None
    if collective == "scatter":
        return lambda: dist.scatter(small, blocks, src=root)
    if collective == "gather":
        return lambda: dist.gather(small, blocks, dst=root)
    raise ValueError(f"no benchmark for {collective!r}")
