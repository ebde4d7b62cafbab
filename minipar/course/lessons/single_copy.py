"""Whether MPI can move a large message inside a node in one copy here: Linux's cross-memory
attach (CMA: process_vm_readv, the receiver copying straight out of the sender's pages), which
MPICH's ch4 uses for large messages where the kernel lets one process read another's memory
(MPIR_CVAR_CH4_CMA_ENABLE; containers or Yama's ptrace_scope can forbid it). Without it a large
message goes through shared cells: the sender copies in, the receiver copies out.

    copies(page.comm)   # 1.0 where rank 1 could read rank 0's memory just now, else 2.0
    read_seconds(page.comm, nbytes)   # that one copy of nbytes between ranks 0 and 1, timed now

The test itself moves 8 bytes: rank 0 tells rank 1 its pid and a buffer's address, rank 1 asks
the kernel for those bytes and compares them with what rank 0 wrote; every rank learns the answer.
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

import minipar

MAGIC = 0x6D696E69706172  # "minipar": what rank 1 must read out of rank 0's buffer


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def read_other(pid: int, address: int, nbytes: int) -> bytes | None:
    """nbytes at `address` in process `pid`, by process_vm_readv; None where the kernel refuses."""
    out = np.empty(nbytes, np.uint8)
    return out.tobytes() if read_into(pid, address, out) else None


def read_into(pid: int, address: int, out: np.ndarray) -> bool:
    """Fill `out` (contiguous) from `address` in process `pid` by process_vm_readv: one copy,
    made by the kernel, the one CMA makes of a large message; False where the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        readv = libc.process_vm_readv
    except (OSError, AttributeError):  # not Linux, or a libc without it
        return False
    local, remote = _IOVec(out.ctypes.data, out.nbytes), _IOVec(address, out.nbytes)
    readv.restype = ctypes.c_ssize_t
    return readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) == out.nbytes


def read_seconds(comm, nbytes: int, reps: int = 5) -> float | None:
    """Seconds rank 1 takes to read nbytes that rank 0 has just written straight out of rank
    0's memory (read_into: the copy CMA makes of a large message, between these two cores
    now), the fastest of reps; None where the kernel refuses (collective)."""
    mine = np.zeros(3, np.int64)
    src = np.ones(nbytes, np.uint8) if comm.rank == 0 else None
    dst = np.ones(nbytes, np.uint8) if comm.rank == 1 else None  # its pages touched
    if comm.rank == 0:
        mine[:2] = os.getpid(), src.ctypes.data
        comm.send(mine, 1)
    elif comm.rank == 1:
        comm.recv(mine, 0)
    best = np.full(1, np.inf)
    for turn in range(reps):
        comm.barrier()
        if comm.rank == 0:
            src.fill(turn % 7)  # written just now, as a message's sender has written it
        comm.barrier()
        if comm.rank == 1:
            t0 = time.perf_counter()
            ok = read_into(int(mine[0]), int(mine[1]), dst)
            best[0] = min(best[0], time.perf_counter() - t0) if ok else np.nan
    minipar.broadcast(best, src=comm.global_ranks[1], group=comm)
    return float(best[0]) if np.isfinite(best[0]) else None


def cma_works(comm) -> bool:
    """Could rank 1 read rank 0's memory just now (collective; False on one rank, or where the
    two are on different nodes: a pid means nothing across them)."""
    node_of = minipar.node_map()
    if comm.size < 2 or node_of[comm.global_ranks[0]] != node_of[comm.global_ranks[1]]:
        return False
    mine = np.array([MAGIC, 0, 0], np.int64)
    if comm.rank == 0:
        mine[1:] = os.getpid(), mine.ctypes.data
        comm.send(mine, 1)
    verdict = np.zeros(1, np.int64)
    if comm.rank == 1:
        theirs = np.empty(3, np.int64)
        comm.recv(theirs, 0)
        got = read_other(int(theirs[1]), int(theirs[2]), 8)
        verdict[0] = got == np.int64(MAGIC).tobytes()
    minipar.broadcast(verdict, src=comm.global_ranks[1], group=comm)
    return bool(verdict[0])


def copies(comm) -> float:
    """Memory copies a large one-way message costs here: 1 by CMA where MPICH may use it, else
    2 (in and out of the shared cells)."""
    allowed = os.environ.get("MPIR_CVAR_CH4_CMA_ENABLE", "1") != "0"
    return 1.0 if allowed and cma_works(comm) else 2.0
