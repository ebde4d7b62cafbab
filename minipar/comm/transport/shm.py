"""Single-copy shared memory: the ranks of a group on one node read each other's memory directly.

MPI inside a node moves a message with two copies: the sender copies it into a shared bounce
buffer, the receiver copies it out. Here every rank owns one segment of an MPI shared window
(`MPI.Win.Allocate_shared` on the `Split_type(COMM_TYPE_SHARED)` communicator) and every rank
maps every segment, so a rank writes its data once into its own segment and its peers reduce
or copy straight out of it: one copy per byte and hop instead of two.

    rank 0's segment  [ header | data ........ ]   written by rank 0 only
    rank 1's segment  [ header | data ........ ]   written by rank 1 only; rank 0 reads it

Synchronisation: each segment starts with a header of counters that only its owner writes
(`READY`: my data up to block b is in place; `REDUCED`: my chunks up to block b are final;
`DONE`: I have finished reading your segments for round k). A round goes in blocks of about
BLOCK_BYTES, pipelined, so that what one rank has just written is still in the shared cache when
its peer reads it (MPI's small bounce cells enjoy the same; a whole 32 MiB chunk would not).
A waiting rank polls a peer's counter, spins briefly, then yields the core with `time.sleep`
(at once when ranks outnumber cores, or on the progress thread, whose caller computes
meanwhile), so it never holds the core the peer needs. Every wait is bounded by the group's
timeout and names the collective, the peer and what it waited for. `MPI_Win_sync` orders the
data before the counter (a memory barrier on weakly ordered CPUs; nearly free on x86).

A buffer that lives in a window of its own (comm/transport/shm_buffers.py: minipar.empty, DDP's
buckets, FSDP's slots) takes rounds of its own (`begin_in_place` / `end_in_place`): nothing is
copied in, the header also names the window and the offset (peers whose twins lie elsewhere raise
MismatchError), and the round ends only when every peer has finished reading, so the caller may
write into its buffer as soon as the call returns.

A `SharedNode` belongs to one group (`node_of(comm)`); calls on it run one at a time, in the
order the caller issued them (a ticket taken in the caller's thread), so an async call on the
progress thread and a blocking one on the main thread never share the segments at once.

Every SharedNode made is kept here until exit, when `free_all` frees its windows just before
MPI_Finalize (comm/guards/leaving.py): MPI_Win_free is collective, so a window cannot be freed
when one rank drops its group, and mpi4py frees nothing when its object is collected. One left
open fails MPICH's MPI_Finalize on its OFI netmod, on every rank: each window registers its
memory with the OFI domain (`win_allgather`, src/mpid/ch4/netmod/ofi/ofi_win.c; only
`MPIDI_OFI_mpi_win_free_hook` closes it), libfabric refuses to close a domain that still has a
registration (-FI_EBUSY, `ofi_domain_close`), MPICH ignores that in
`MPIDI_OFI_mpi_finalize_hook` (ofi_init.c), and then the fabric, whose domain is still open,
refuses too: "OFI call fabricclose failed (... Device or resource busy)", exit 15.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

import numpy as np

from minipar.comm.transport.base import patience, pause, wait_all
from minipar.comm.transport.mpi_requests import module
from minipar.errors import CommTimeoutError, MismatchError

HEADER = 4096  # bytes before the data: a page, so the data is page-aligned
# header slots (int64 each): the three counters, then what this round is (checked by every peer
# before it reads: the call's code and size, and for a buffer that lives in a window of its own,
# that window's serial number and the buffer's byte offset in it; -1 and 0 for a staged round)
READY, REDUCED, DONE, CODE, NBYTES, WINDOW, OFFSET = range(7)
MAX_SEGMENT = int(os.environ.get("MINIPAR_SHM_BYTES", 64 << 20))  # data bytes per rank, at most
BLOCK_BYTES = int(os.environ.get("MINIPAR_SHM_BLOCK", 1 << 20))  # a pipeline block, all chunks
LAG = int(os.environ.get("MINIPAR_SHM_LAG", 8))  # blocks between publishing and reading them
WAITS = ("publish its data", "finish reducing its chunk", "finish reading my segment")
MADE: list = []  # every SharedNode of this process, in the order made: free_all frees them
FREE_WITHIN = 10.0  # seconds free_all waits for a node's peers (they left the exit check with it)


def node_of(comm, what: str = "shared memory"):
    """The SharedNode of `comm` when every rank of it shares this node, else None.

    Collective over comm the first time (MPI_Comm_split_type): every rank must ask at the same
    point, which `transport.route` guarantees (it decides from arguments all ranks share). A
    barrier bounded by the timeout goes first, so a missing rank is a CommTimeoutError (opening
    with `what`), not a hang inside the blocking split."""
    cached = getattr(comm, "_shm_node", False)
    if cached is not False:
        return cached
    node = None
    if getattr(comm, "backend", None) == "mpi" and comm.size > 1:
        MPI = module()
        context = f"{what}: probing whether group {comm.name} shares one node"
        wait_all([comm._post_barrier()], comm.timeout, context)
        local = comm.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
        everyone = comm.mpi.allreduce(int(local.Get_size() == comm.size), op=MPI.MIN)
        if everyone:
            node = SharedNode(comm, local)
            MADE[:] = [n for n in MADE if n.holds()] + [node]
        else:
            local.Free()
    comm._shm_node = node
    return node


class SharedNode:
    """The shared segments of one node-local group, their counters and the call order."""

    def __init__(self, comm, local):
        self._comm, self.gid = weakref.ref(comm), comm.gid  # MADE keeps the node, not the group
        self.mpi, self.rank, self.size = local, comm.rank, comm.size
        self.win, self.capacity, self.round = None, 0, 0
        self.blocks = 0  # blocks finished in earlier rounds: READY and REDUCED count blocks
        self.segments, self.headers = [], []
        self.buffers = []  # shm_buffers.py: the windows buffers live in, in allocation order
        self.windows_made = 0  # their serial numbers (the same on every rank)
        self._order = threading.Condition()
        self._issued = self._turn = 0

    @property
    def comm(self):
        """The group (None once it is gone: only free_all uses the node then)."""
        return self._comm()

    def holds(self) -> bool:
        """Whether a window or the node's communicator is still open here."""
        return bool(self.mpi) or bool(self.win) or any(w.win for w in self.buffers)

    def free(self) -> None:
        """Free the windows (buffers' in allocation order, then the staging one) and the node's
        communicator: collective over the node's group, as on every member. Those a caller
        freed already (testing/groups.py) are null handles, skipped."""
        for buffer in self.buffers:
            if buffer.win:
                buffer.free()
        self.buffers, self.segments, self.headers = [], [], []
        if self.win:
            self.win.Unlock_all()
            self.win.Free()
        if self.mpi:
            self.mpi.Free()

    # -- call order --------------------------------------------------------------------------
    def ticket(self) -> int:
        """Taken in the caller's thread when the call is made: its place in the queue."""
        with self._order:
            self._issued += 1
            return self._issued - 1

    def run(self, ticket: int, what: str, fn) -> None:
        """Run fn() once every call issued before this one has finished on this rank."""
        with self._order:
            if not self._order.wait_for(lambda: self._turn == ticket, self.comm.timeout):
                raise CommTimeoutError(
                    f"{what}: timed out after {self.comm.timeout:g} s waiting for this rank's "
                    f"earlier shared-memory call #{self._turn} to finish"
                )
        try:
            fn()
        finally:
            with self._order:
                self._turn += 1
                self._order.notify_all()

    # -- rounds --------------------------------------------------------------------------
    def begin(self, nbytes: int, code: int, what) -> np.ndarray:
        """Start a round that publishes nbytes: wait until every peer finished reading my
        segment (the previous round), grow the window if needed; returns my data segment."""
        self.round += 1
        k = self.round
        for q in self.peers():
            self.wait(q, DONE, k - 1, what)
        if nbytes > self.capacity or self.win is None:
            self._grow(nbytes, what)
        head = self.headers[self.rank]
        head[CODE], head[NBYTES], head[WINDOW], head[OFFSET] = code, nbytes, -1, 0
        return self.segments[self.rank]

    def begin_in_place(self, window: int, offset: int, nbytes: int, code: int, what) -> None:
        """Start a round on a buffer that already lies in window `window` (its serial number)
        at byte `offset` on every rank: nothing is copied in, the peers read it where it is.
        The counters are the staged rounds' (the first such round maps a small staging window
        for them); `end_in_place` closes the round."""
        self.round += 1
        for q in self.peers():
            self.wait(q, DONE, self.round - 1, what)
        if self.win is None:
            self._grow(0, what)
        head = self.headers[self.rank]
        head[CODE], head[NBYTES], head[WINDOW], head[OFFSET] = code, nbytes, window, offset

    def end_in_place(self, what) -> None:
        """I finished reading the peers' buffers; return once they finished reading mine: the
        caller may write into its buffer as soon as this returns."""
        self.publish(DONE)
        self.wait_all(DONE, what)

    def publish(self, slot: int, value: int | None = None) -> None:
        """Set my counter `slot` (to this round, or to a block number): the data it stands for
        (READY: published; REDUCED: my chunk final; DONE: I read what I needed) is in place."""
        self.win.Sync()  # the data before the counter, on every CPU
        self.headers[self.rank][slot] = self.round if value is None else value

    def wait_all(self, slot: int, what, value: int | None = None) -> None:
        for q in self.peers():
            self.wait(q, slot, self.round if value is None else value, what)

    def peers(self):
        return (q for q in range(self.size) if q != self.rank)

    def wait(self, q: int, slot: int, k: int, what) -> None:
        """Until peer q's counter `slot` reaches round k, within the group's timeout."""
        head = self.headers[q] if self.headers else None
        if head is None or k <= 0:
            return
        if head[slot] < k:
            self._poll(head, slot, k, q, what)
        self.win.Sync()  # read the data only after seeing the counter
        if slot == READY:
            mine = self.headers[self.rank]
            if any(head[s] != mine[s] for s in (CODE, NBYTES, WINDOW, OFFSET)):
                raise MismatchError(
                    f"{what() if callable(what) else what}: rank {q} of group {self.comm.name} "
                    f"published {_round(head)}, this rank {_round(mine)}; every rank must make "
                    "the same collective calls in the same order with matching sizes (and a "
                    "buffer from minipar.empty on every rank, or on none)"
                )

    def _poll(self, head, slot, k, q, what) -> None:
        start, timeout = time.monotonic(), self.comm.timeout
        spin, nap = patience()  # the progress thread naps at once: comm/transport/base.py
        while head[slot] < k:
            failure = getattr(self.comm, "_failure", None)  # the MPI watchdog saw a mismatch
            if failure is not None:
                raise MismatchError(failure)
            elapsed = time.monotonic() - start
            if elapsed > timeout:
                where = what() if callable(what) else what
                raise CommTimeoutError(
                    f"{where}: timed out after {timeout:g} s waiting for rank {q} to "
                    f"{WAITS[slot]} (shared-memory round {k}) on group {self.comm.name}"
                )
            if elapsed > spin:  # yield: the peer, or our caller, may need this very core
                time.sleep(pause(elapsed, nap))

    # -- the window ----------------------------------------------------------------------
    def _grow(self, nbytes: int, what) -> None:
        """A bigger window, collectively (all ranks reach the same round with the same size).
        Everyone has finished the previous round (begin waited for DONE), so freeing is safe."""
        MPI = module()
        size = max(nbytes, min(MAX_SEGMENT, 2 * self.capacity), 1 << 16)
        size = -(-size // 4096) * 4096
        if self.win is not None:
            self.win.Unlock_all()
            self.win.Free()
        self.win = MPI.Win.Allocate_shared(HEADER + size, 1, comm=self.mpi)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.capacity = size
        raw = []
        for q in range(self.size):
            buf, _ = self.win.Shared_query(q)
            raw.append(np.frombuffer(buf, dtype=np.uint8, count=HEADER + size))
        self.headers = [r[:HEADER].view(np.int64) for r in raw]
        self.segments = [r[HEADER:] for r in raw]
        mine = self.headers[self.rank]
        mine[:] = 0
        mine[READY] = mine[REDUCED] = self.blocks  # no block of this round is in place
        mine[DONE] = self.round - 1
        self.win.Sync()
        request = self.mpi.Ibarrier()  # nobody reads a header before its owner set it
        start = time.monotonic()
        while not request.Test():
            if time.monotonic() - start > self.comm.timeout:
                raise CommTimeoutError(
                    f"{what() if callable(what) else what}: timed out after "
                    f"{self.comm.timeout:g} s waiting for the other ranks to map a "
                    f"{size}-byte shared window on group {self.comm.name}"
                )
            time.sleep(0)
        self.win.Sync()


def free_all(within: float = FREE_WITHIN) -> bool:
    """Free every SharedNode's windows (at exit, before MPI_Finalize); False when a peer did not
    come within `within` seconds (a rank that ended otherwise), the rest then left open.

    Sorted by group id, which every member shares (a stable sort keeps a reused id's nodes in
    the order made), so two ranks of two node groups free them in the same order, never each
    waiting in another group's MPI_Win_free. A barrier bounded in time goes before each node's
    frees: MPI_Win_free blocks until every member calls it (MPICH's `MPIDIG_mpi_win_free`
    begins with a barrier, src/mpid/ch4/src/mpidig_win.c)."""
    for node in sorted(MADE, key=lambda n: n.gid):
        if node.mpi and not _arrived(node.mpi.Ibarrier(), within):
            return False
        node.free()
    MADE.clear()
    return True


def _arrived(request, within: float) -> bool:
    end = time.monotonic() + within
    while not request.Test():
        if time.monotonic() > end:
            return False
        time.sleep(1e-3)
    return True


def _round(head) -> str:
    """What a header says its round is, for a mismatch's message."""
    where = "staged"
    if head[WINDOW] >= 0:
        where = f"in window buffer #{int(head[WINDOW])} at byte {int(head[OFFSET])}"
    return f"{int(head[NBYTES])} bytes for call code {int(head[CODE])} ({where})"


def describe(comm) -> str:
    """What this group's windows are, in a line."""
    node = getattr(comm, "_shm_node", False)
    if node is False:
        return "shared memory: not probed yet"
    if node is None:
        return "shared memory: unavailable (the group spans nodes, or is not MPI)"
    return f"shared memory: single-copy windows across all {comm.size} ranks of {comm.name}"
