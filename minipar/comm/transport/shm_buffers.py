"""Buffers that live in a node's shared memory from the start, so that peers read them in place.

A user's tensor sits in private memory: to reduce it over shared windows (comm/transport/shm.py)
each rank first copies it into its segment. A buffer minipar owns (DDP's buckets, FSDP's flat
vectors, a user's `minipar.empty(...)`) can instead be allocated in a shared window of its own, one
segment per rank, so the peers reduce or copy straight out of it: no copy in, as NCCL's P2P
transport reads a peer GPU's buffer.

    mine = allocate(node, nbytes, what)      # collective over the node's group, same nbytes:
                                             # my segment, a uint8 numpy array to view as I like
    find(node, x)                            # (window, byte offset) if x lies in one, else None

Every rank allocates the same windows in the same order, so a buffer at byte offset o of
window #k on one rank has its twin at offset o of window #k on every other rank: a peer's twin
is `window.segments[q][o : o + nbytes]`. The in-place rounds (shm.SharedNode.begin_in_place)
publish k and o beside the size, and a peer whose twin is elsewhere is a MismatchError.

Lifetime. MPI_Win_free is collective, so a window cannot be freed when one rank drops its
buffer. Dropping it marks the window unused on that rank (a weakref on the array the caller's
views keep alive); the next allocation on the node asks every rank (one small all-gather, with
the group's timeout) and frees, on every rank alike, the windows that no rank uses any more.
The rest are freed at exit, just before MPI_Finalize (shm.free_all). The node keeps its
windows in `node.buffers` (state of the group's SharedNode, which shm.py keeps until then).
"""

from __future__ import annotations

import weakref

import numpy as np

from minipar.comm.transport.mpi_requests import module

ALIGN = 64  # byte alignment of the buffers carved out of one window (a cache line)


class Window:
    """One MPI shared window: `nbytes` on every rank of a node, rank q's at segments[q]."""

    def __init__(self, node, nbytes: int, serial: int):
        MPI = module()
        self.serial, self.nbytes, self.rank = serial, nbytes, node.rank
        size = -(-max(nbytes, 1) // 4096) * 4096  # whole pages: segments never share a line
        self.win = MPI.Win.Allocate_shared(size, 1, comm=node.mpi)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.segments = []
        for q in range(node.size):
            buf, _ = self.win.Shared_query(q)
            self.segments.append(np.frombuffer(buf, dtype=np.uint8, count=nbytes))
        self.start = address(self.segments[node.rank])
        self.used = True

    def mine(self) -> np.ndarray:
        """This rank's segment as a new array whose life is watched (call it once): when the
        caller's last view of it goes, the window is marked unused here."""
        buf, _ = self.win.Shared_query(self.rank)
        mine = np.frombuffer(buf, dtype=np.uint8, count=self.nbytes)
        weakref.finalize(mine, _unused, weakref.ref(self))
        return mine

    def free(self) -> None:
        """Collective over the node: every rank frees its windows in the same order."""
        self.segments = []
        self.win.Unlock_all()
        self.win.Free()


def _unused(window_ref) -> None:
    window = window_ref()
    if window is not None:
        window.used = False


def address(x) -> int:
    """The address of a buffer's first byte (numpy array or CPU torch tensor)."""
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    return x.data_ptr()


def allocate(node, nbytes: int, what: str) -> np.ndarray:
    """My segment of a new window of nbytes per rank on the node's group (collective: every
    rank, same nbytes, in the same order). Frees, first, the windows no rank uses any more."""
    seen = node.comm.allgather_object(
        (nbytes, [w.used for w in node.buffers]), f"{what}: allocating a shared-memory buffer"
    )
    sizes = [s for s, _ in seen]
    if len(set(sizes)) > 1:
        raise ValueError(
            f"{what}: the ranks of group {node.comm.name} asked for shared buffers of different "
            f"sizes ({', '.join(f'rank {r}: {s} bytes' for r, s in enumerate(sizes))}); every "
            "rank must allocate the same buffers in the same order"
        )
    used = [any(flags) for flags in zip(*(u for _, u in seen))] if node.buffers else []
    keep = []
    for window, still in zip(node.buffers, used):
        if still:
            keep.append(window)
        else:
            window.free()
    node.buffers = keep
    node.windows_made += 1
    window = Window(node, nbytes, node.windows_made)
    node.buffers.append(window)
    return window.mine()


def find(node, x):
    """(window, byte offset) of buffer x when all of its bytes lie in one of the node's windows
    on this rank, else None. A linear scan: a node has a few windows (one per DDP, per FSDP)."""
    if not node.buffers:
        return None
    start = address(x)
    for window in node.buffers:
        offset = start - window.start
        if 0 <= offset and offset + _nbytes(x) <= window.nbytes:
            return window, offset
    return None


def twins(node, x) -> list:
    """Every rank's twin of window buffer x, as uint8 numpy arrays (x's own bytes at my rank)."""
    window, offset = find(node, x)
    return [seg[offset : offset + _nbytes(x)] for seg in window.segments]


def _nbytes(x) -> int:
    if isinstance(x, np.ndarray):
        return x.nbytes
    return x.numel() * x.element_size()
