"""A buffer that lives in the node's shared window, for all-reduces that read peers in place.

    x = minipar.empty((1 << 20,), torch.float32)     # collective: every rank of the group
    x.copy_(gradients)
    minipar.all_reduce(x)                            # peers read x where it lies: no copy in

On a group whose ranks share one node over MPI, with the fast paths on, the buffer is this
rank's segment of a new MPI shared window (comm/transport/shm_buffers.py): the all-reduce,
all-gather (of a window output) and reduce-scatter (of a window input) of it read the peers' twins
in place (collectives/fast/in_place.py), one copy per byte and hop fewer than a user's private
tensor takes. Everywhere else (one rank, the torch transport, ranks on several nodes, the fast
paths off, MINIPAR_TRANSPORT=mpi) it is a private buffer of the same shape and dtype, so the
same program runs anywhere. Either way an `auto` call on it runs the ring (the order the
in-place schedule keeps): the same bits wherever the buffer lives.

Every rank of the group must ask for the same shape and dtype in the same order, and call the
collectives on the twins at the same places (the in-place round checks it: MismatchError).
Like torch.empty the contents are undefined until written. DDP's buckets and FSDP's flat
vectors come from here.
"""

from __future__ import annotations

import math

import numpy as np

from minipar import runtime
from minipar.collectives.fast import routing
from minipar.comm.transport import buffers, shm, shm_buffers
from minipar.state import process


def empty(shape, dtype="float32", group=None):
    """An uninitialised buffer of `shape` in the group's shared window (see the module): a torch
    tensor for a torch dtype, else a numpy array of numpy.dtype(dtype). Collective."""
    comm = runtime.resolve(group)
    shape = _shape(shape)
    torch_dtype, np_dtype = _dtype(dtype)
    itemsize = torch_dtype.itemsize if torch_dtype is not None else np_dtype.itemsize
    nbytes = math.prod(shape) * itemsize
    node = shared_node(comm, f"minipar.empty({shape}, {dtype}) on group {comm.name}")
    if node is None:
        if torch_dtype is not None:
            return buffers.torch_module().empty(shape, dtype=torch_dtype)
        return np.empty(shape, np_dtype)
    raw = shm_buffers.allocate(node, nbytes, f"minipar.empty({shape}, {dtype})")
    if torch_dtype is not None:
        return buffers.torch_module().from_numpy(raw).view(torch_dtype).view(shape)
    return raw.view(np_dtype).reshape(shape)


def shared_node(comm, what: str):
    """The group's SharedNode when buffers should live in its windows, else None (collective
    the first time: it may probe the node)."""
    if comm.size == 1 or comm.backend != "mpi" or not process.fast_paths:
        return None
    if routing.requested() == "mpi":
        return None
    return shm.node_of(comm, what)


def in_window(x, group=None) -> bool:
    """Whether buffer x lies (all of it) in a shared window of the group's node on this rank."""
    node = getattr(runtime.resolve(group), "_shm_node", None)
    return bool(node) and not buffers.is_cuda(x) and shm_buffers.find(node, x) is not None


def _shape(shape) -> tuple:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in dims):
        raise ValueError(f"shape must be a tuple of non-negative ints, got {shape!r}")
    return dims


def _dtype(dtype):
    """(torch dtype, None) or (None, numpy dtype)."""
    torch = buffers.torch_module() if "torch" in type(dtype).__module__ else None
    if torch is not None and isinstance(dtype, torch.dtype):
        return dtype, None
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a torch dtype or a numpy dtype, got {dtype!r}") from None
    if np_dtype.hasobject:
        raise TypeError(f"dtype {dtype!r} holds Python objects: no shared buffer can hold them")
    return None, np_dtype
