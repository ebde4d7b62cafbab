"""The fast paths: the same messages and the same results as the plain path, in less time.

A student can read past this folder. `collectives/api.py` checks a call's arguments, picks its
algorithm (`registry.pick`: the cost model's choice) and runs it, step by step, in the algorithm's
own file (`ring.py`, `tree.py`, ...). Four shortcuts sit beside that path, each one taken only
where its result is bitwise the plain one's:

    lean.py     a small blocking all-reduce runs from a plan worked out once per call shape
                (the schedule, the signature's hash, a scratch buffer, the kernel); a larger
                one on a CPU torch tensor runs on its memory as a numpy array (numpy_view)
    direct.py   a step on numpy buffers over MPI posts mpi4py's own requests instead of
                minipar's Request objects (Call.send / recv / sendrecv take it)
    pieces.py   a large ring all-reduce over MPI receives each reduce-scatter step in pieces
                and reduces each while it is in cache (routing.py picks it)
    routing.py  inside one node, the bandwidth algorithms of all-reduce, all-gather and
    windows.py  reduce-scatter run over shared windows (transport/shm.py), one copy a hop, when the
                cost model prices that cheaper (or when asked: "ring@shm", MINIPAR_TRANSPORT)
    in_place.py and a buffer that lives in a window (minipar.empty: DDP's buckets, FSDP's
                flat vectors) is reduced where it lies, with no copy at all

The switch: `minipar.init(fast_paths=False)` or MINIPAR_FAST_PATHS=0 turns them all off
(`process.fast_paths`, minipar.state), so every call takes the path the algorithm files show;
an explicit request for the windows ("ring@shm", MINIPAR_TRANSPORT=shm) is still honoured.
tests/test_fast_paths.py checks that every collective gives the same bits either way.
"""

from __future__ import annotations

import numpy as np

from minipar.collectives.fast import lean, routing
from minipar.state import process


def all_reduce(comm, tensor, op, algorithm) -> bool:
    """True if a blocking all-reduce ran on the lean path (lean.py); False: take the plain one."""
    return process.fast_paths and lean.all_reduce(comm, tensor, op, algorithm)


def numpy_view(comm, x, op):
    """x's memory as a numpy array for an all-reduce over MPI when x is a CPU torch tensor: the
    steps then take direct.py's requests (numpy buffers only), where a torch tensor's steps pay
    minipar's Request objects and views. Only where numpy's kernels give torch's bits
    (lean.EXACT_OPS) and nothing records the call; x itself otherwise."""
    if type(x) is np.ndarray or not process.fast_paths or process.traces or comm.backend != "mpi":
        return x
    view = lean._torch_view(x, op)
    return x if view is None else view


def window_of(comm, collective: str, nbytes: int, args):
    """Where this call's buffer lies when it lives in a shared window (minipar.empty), else
    None; asked with the fast paths on or off (routing.py)."""
    return routing.window_of(comm, collective, nbytes, args)


def route(comm, collective: str, name: str, fn, nbytes: int, buf, place=None):
    """(name, function) that run this call: the algorithm as picked, or its schedule over
    shared windows, staged or, for a buffer at `place`, in place (routing.py)."""
    return routing.route(comm, collective, name, fn, nbytes, buf, place)


def direct_steps(comm) -> bool:
    """Whether this group's steps on numpy buffers may take mpi4py's own requests (direct.py)."""
    return process.fast_paths and comm.backend == "mpi"
