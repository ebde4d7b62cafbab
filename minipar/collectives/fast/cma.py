"""Fast path: the ring all-reduce with one copy a byte, each rank reading its left neighbour's
buffer where it lies (Linux's Cross Memory Attach, process_vm_readv).

An MPI message between two ranks of one node is two copies through shared cells (the sender's in,
the receiver's out), and the ring's reduce-scatter adds a scratch buffer the receive wrote out to
memory: five passes over memory where the roofline needs two (cost/roofline.py). The kernel can
copy straight from another process's memory into ours, the single copy MPICH and Open MPI use
inside a node where they are built with it (CMA, or XPMEM). This MPICH wheel is not, so minipar
does it itself: the ring's schedule is unchanged, its data messages become reads, and what goes
over MPI is one small token per neighbour and step saying "my chunk is ready" (to the right) and
"I have read yours" (to the left).

    start:           tell the right where my x lies (pid, address) = my "ready" for step 0
    reduce-scatter step s (0 <= s < p-1): read chunk c = (r-s-2) of the left's x, which the
                     left reduced in its step s-1, in pieces of PIECE_BYTES into a scratch that
                     stays in cache, x_c[k] op= piece (ring.py's order, so its bits); then tell
                     the left I have read, wait for the right to have read mine, tell the right
                     my chunk is ready, wait for the left's
    all-gather step s (0 <= s < p-1): the same, reading chunk (r-s-1), final on the left,
                     straight into my x

Per rank: 2 (p-1)/p n bytes read from the neighbour's memory, as the ring sends; 2 (p-1) steps,
each two 8-byte token exchanges (the ready one carries nothing but the step's turn). Why the
"I have read" token: a rank overwrites, in the all-gather, the chunk its right neighbour read in
the reduce-scatter; and it may return (and its caller change x) only once nobody reads it.

Taken (fast/routing.py) for a blocking ring all-reduce of a numpy buffer over MPI, no trace open,
on a group whose ranks share one node and can read each other's memory (`usable`: probed once
per group, collectively: same user, no seccomp filter or Yama policy refusing it), above
MIN_BYTES; never in the student edition (pieces.ring_is_minipars).
"""

from __future__ import annotations

import ctypes
import os
import secrets

import numpy as np

from minipar.collectives import layout
from minipar.collectives.fast import pieces
from minipar.collectives.reduce_op import reduce_

PIECE_BYTES = pieces.PIECE_BYTES  # a piece that stays in a core's cache while it is added
MIN_BYTES = 1 << 20  # below: the tokens' latency outweighs the copy saved (MPI's path)


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    read = libc.process_vm_readv
    read.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                     ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong]  # fmt: skip
    read.restype = ctypes.c_ssize_t
    return read


_READ = []  # process_vm_readv, bound on first use


def read(pid: int, address: int, into: np.ndarray) -> None:
    """Copy into.nbytes bytes at `address` in process `pid` into the contiguous array `into`."""
    if not _READ:
        _READ.append(_libc())
    local, remote = _IOVec(into.ctypes.data, into.nbytes), _IOVec(address, into.nbytes)
    done = _READ[0](pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if done != into.nbytes:
        errno = ctypes.get_errno()
        raise OSError(errno, f"process_vm_readv from pid {pid}: {os.strerror(errno)}")


def usable(comm) -> bool:
    """Whether every rank of `comm` can read its left neighbour's memory (collective the first
    time, cached on the group): each rank shows a random cookie, reads its left's, and the ranks
    agree. Only where every rank shares this node (shm.node_of); never off Linux."""
    cached = getattr(comm, "_cma", None)
    if cached is not None:
        return cached
    from minipar.comm.transport import shm  # here: the probe runs once per group

    ok = False
    if hasattr(os, "process_vm_readv") or os.uname().sysname == "Linux":
        if shm.node_of(comm, "single-copy reads (process_vm_readv)") is not None:
            cookie = np.frombuffer(secrets.token_bytes(8), dtype=np.uint64).copy()
            seen = comm.allgather_object((os.getpid(), cookie.ctypes.data, int(cookie[0])))
            pid, address, value = seen[(comm.rank - 1) % comm.size]
            got = np.zeros(1, np.uint64)
            try:
                read(pid, address, got)
                mine = int(got[0]) == value
            except OSError:
                mine = False
            ok = all(comm.allgather_object(mine))
    comm._cma = ok
    return ok


def worth_it(comm, nbytes: int) -> bool:
    return comm.size > 1 and nbytes >= MIN_BYTES and usable(comm)


def all_reduce_ring_cma(call, x, op) -> None:
    """The ring all-reduce of ring.py on a contiguous numpy x, each step's chunk read from the
    left neighbour's x (the module docstring's schedule)."""
    p, r = call.size, call.rank
    right, left = (r + 1) % p, (r - 1) % p
    edges = layout.bounds(len(x), p)
    step = max(1, PIECE_BYTES // x.itemsize)
    scratch = np.empty(min(step, edges[1]), dtype=x.dtype)
    where = np.array([os.getpid(), x.ctypes.data], dtype=np.int64)
    theirs = np.empty(2, dtype=np.int64)
    call.sendrecv(where, right, theirs, left)  # ready for step 0, and where to read
    pid, base = int(theirs[0]), int(theirs[1])
    token, token_in = np.zeros(1, np.int64), np.empty(1, np.int64)
    for s in call.rounds(2 * (p - 1)):
        reducing = s < p - 1  # then the all-gather's steps, s - (p-1)
        c = (r - s - 2) % p if reducing else (r - (s - p + 1) - 1) % p
        mine = layout.chunk(x, edges, c)
        at = base + edges[c] * x.itemsize
        if reducing:
            for a in range(0, len(mine), step):
                piece = mine[a : a + step]
                got = scratch[: len(piece)]
                read(pid, at + a * x.itemsize, got)
                reduce_(piece, got, op)  # x_c = x_c op received, as ring.py
        elif len(mine):
            read(pid, at, mine)
        call.sendrecv(token, left, token_in, right)  # I have read yours / the right has mine
        call.sendrecv(token, right, token_in, left)  # my chunk is ready / the left's is
