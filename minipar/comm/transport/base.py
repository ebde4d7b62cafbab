"""What every transport offers: ranks, point-to-point messages, requests that time out, sub-groups.

A transport moves the bytes of one contiguous buffer from one rank to another and nothing more.
Everything above it (collectives, strategies, lessons) talks to this interface only, so the same
ring all-reduce runs over mpi4py under mpiexec and over torch.distributed under torchrun.

Tags (see TagLayout): user point-to-point messages use tags below `COLLECTIVE_TAG_BASE` (2^15);
a few control tags sit just above; each collective call takes one tag from the top half of the
transport's tag range, made of its group's sequence number and a hash of its signature chained
with the signatures of the group's earlier calls (its history), so collectives in flight at the
same time (async ones, or on different threads) never match each other's messages, and neither
do ranks that disagree about a call, or about any call before it.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

from minipar.comm.trace import ledger, signature
from minipar.comm.transport import buffers
from minipar.errors import CommTimeoutError, MiniparError, MismatchError
from minipar.state import process

COLLECTIVE_TAG_BASE = 1 << 15  # user tags live in [0, 2**15), as MPI guarantees at least that
CONTROL_TAG = COLLECTIVE_TAG_BASE  # debug mode's fingerprints
NOTICE_TAG = COLLECTIVE_TAG_BASE + 1  # mismatch notices between watchdogs (guards/watchdog.py)
REPLY_TAG_BASE = COLLECTIVE_TAG_BASE + 16  # answers to stalled ranks' questions (guards/stall.py),
REPLY_TAGS = 1 << 14  # one tag per question, so two threads never take each other's answer
SEQ_BITS = 12  # a call's tag keeps its sequence number modulo 4096
SEQ_MASK = (1 << SEQ_BITS) - 1
_cached_hash = signature._HASHES.get
DEFAULT_TIMEOUT = 300.0  # seconds; generous, because a first CUDA call or a cold start is slow
DEFAULT_MISMATCH_AFTER = 1.0  # seconds a collective waits before asking its peers (stall.py)
STALL_AFTER = 0.01  # seconds after which a wait counts as stuck (comm/guards/stall.py registers it)
# odd, so history -> (history * M xor hash) mod 2^H is one-to-one; small, so that with H <= 18
# every intermediate value stays below 2^30, one digit of a Python int (no big-int arithmetic)
HISTORY_MULTIPLIER = 2531

# busy-poll this long (keeps small-message latency low), then yield; when ranks outnumber cores
# (the launcher sets MINIPAR_OVERSUBSCRIBED=1) spinning only steals the core from the peer we
# wait for, so yield at once
SPIN_SECONDS = 0.0 if os.environ.get("MINIPAR_OVERSUBSCRIBED") == "1" else 2e-3
# when ranks share cores, a wait past its first millisecond naps a tenth of the time it has
# waited so far (at most 1 ms): each wake-up takes the core from a rank with work to do (on 2
# cores, 8 ranks' wake-ups were a quarter of a GPT step's time), and a message is taken at
# most about 10% later than it came
BACKOFF_AFTER, BACKOFF = 1e-3, 0.1
# a collective on the progress thread (collectives/work.py) runs beside its caller's own work
# (DDP's backward, on the same cores): spinning there takes the core from that work, so its
# waits sleep at once, this long at least (the kernel wakes it some tens of us later)
BACKGROUND_NAP = 2e-5


def patience() -> tuple[float, float]:
    """(seconds to spin, shortest nap after that) for a wait on the calling thread: the
    progress thread naps at once, any other spins SPIN_SECONDS, then yields (a nap of 0)."""
    progress = process.progress
    if progress is not None and threading.current_thread() is progress.thread:
        return 0.0, BACKGROUND_NAP
    return SPIN_SECONDS, 0.0


def pause(elapsed: float, nap: float) -> float:
    """Seconds to nap before the next poll of a wait that has lasted `elapsed` seconds, past
    its spin (`nap`: patience()'s shortest; 0 is a yield of the core)."""
    if SPIN_SECONDS == 0.0:  # oversubscribed: back off
        return max(nap, 0.0 if elapsed < BACKOFF_AFTER else min(BACKOFF * elapsed, 1e-3))
    return max(nap, 0.0 if elapsed < 0.05 else 1e-4 if elapsed < 0.5 else 1e-3)


def crosses_nodes(requests) -> bool:
    """Whether any request's peer is on another node (the node map of runtime/nodes.py)."""
    nodes = process.nodes
    if nodes is None or nodes.n_nodes < 2:
        return False
    node_of = nodes.node_of
    for request in requests:
        ranks, peer = request.comm.global_ranks, request.peer
        if 0 <= peer < len(ranks) and node_of[ranks[peer]] != node_of[ranks[request.comm.rank]]:
            return True
    return False


def keep_moving(nap: float) -> None:
    """What a wait does between two polls while a message to or from another node is pending:
    yield the core, never nap.

    Between nodes the MPI's network transport (TCP here: UCX's or Open MPI's) moves bytes only
    inside a call into the MPI: each poll writes what the socket takes and reads what has come.
    A nap (pause) leaves the link idle meanwhile: with ranks outnumbering cores, a 1 MiB exchange
    across took 5x raw mpi4py's time at 2 Gbit/s, up to 36x unshaped (issue 62, docs/cluster.md).
    sched_yield hands the core to any rank with work to do (the kernel runs the yielder after
    it) and polls again at once when none has: the link runs at its rate, and ranks computing
    beside lose almost nothing. Waits inside a node still nap (pause), to leave the core to the
    very peer they wait for. The progress thread keeps its short nap (patience): polling in a
    tight loop, it would contend for the GIL with its caller's work (DDP's backward).
    """
    if nap:
        time.sleep(nap)
    else:
        _yield()


_yield = getattr(os, "sched_yield", lambda: time.sleep(0))  # sched_yield(2): not on Windows


def env_timeout() -> float:
    """MINIPAR_TIMEOUT: seconds any wait may take (default DEFAULT_TIMEOUT)."""
    return env_seconds("MINIPAR_TIMEOUT", DEFAULT_TIMEOUT)


def env_mismatch_after() -> float:
    """MINIPAR_MISMATCH_AFTER: seconds a collective call waits before it asks its peers which
    call they are in (comm/guards/stall.py); default 1."""
    return env_seconds("MINIPAR_MISMATCH_AFTER", DEFAULT_MISMATCH_AFTER)


def env_seconds(name: str, default: float) -> float:
    """The positive number of seconds in environment variable `name` (default when unset)."""
    value = os.environ.get(name)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if not seconds > 0:  # also NaN
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return seconds


class TagLayout:
    """Where a collective call's tag comes from, given the transport's largest tag `tag_ub`.

        tag = 2^(B-1) + (seq mod 2^12) * 2^H + history

    where history (H bits) is the hash of the call's signature chained with the group's earlier
    calls (Communicator.next_collective_tag), with 2^B - 1 <= tag_ub: the top half of the tag range
    belongs to collectives, user tags [0, 2^15) and the control tags (2^15, 2^15 + 1, and the
    answers from 2^15 + 16 on) stay below it. MPICH's bound 2^29 - 1
    gives H = 16 hash bits, Open MPI's (and torch's) 2^31 - 1 give H = 18. Two ranks that
    disagree on a call get the same tag only if their hashes collide: probability 2^-H per
    mismatched call (1 in 65,536 on MPICH), and then the call behaves as before this check
    (the sizes may still differ and raise, else it completes with a wrong answer).
    """

    def __init__(self, tag_ub: int):
        bits = (tag_ub + 1).bit_length() - 1
        if bits < SEQ_BITS + 5:
            raise MiniparError(
                f"this transport's largest tag is {tag_ub}; minipar needs at least "
                f"{(1 << (SEQ_BITS + 5)) - 1} (collective tags carry a sequence number and hash)"
            )
        self.base = 1 << (bits - 1)
        self.hash_bits = bits - 1 - SEQ_BITS
        self.hash_mask = (1 << self.hash_bits) - 1

    def tag(self, seq: int, sig_hash: int) -> int:
        return self.base + ((seq % (1 << SEQ_BITS)) << self.hash_bits) + (sig_hash & self.hash_mask)

    def decode(self, tag: int):
        """(seq mod 2^12, hash bits) of a collective tag, or None for a user or control tag."""
        if tag < self.base:
            return None
        return (tag - self.base) >> self.hash_bits, tag & self.hash_mask


class Request:
    """A message in flight. `test()` polls, `wait()` blocks until done or the timeout.

    Transports subclass this and implement `_poll()`, returning True once the message is
    complete (and having checked its size), and optionally `_finish()` (copy a staged buffer back).
    """

    def __init__(self, comm: Communicator, kind: str, peer: int, tag: int, nbytes: int):
        self.comm, self.kind, self.peer, self.tag, self.nbytes = comm, kind, peer, tag, nbytes
        self.done = False

    blocking = False  # True: cannot be polled, wait_all calls _block(seconds) instead
    traced = None  # a traced receive: the ledger's Clock, told when the message completed

    def _poll(self) -> bool:  # pragma: no cover - every transport overrides it
        raise NotImplementedError

    def _block(self, seconds: float) -> bool:  # pragma: no cover
        """Wait up to `seconds`; True when complete. Only for requests with `blocking = True`."""
        raise NotImplementedError

    def _finish(self) -> None:
        pass

    def _cancel(self) -> None:
        """Best effort: stop a pending receive from ever writing into its buffer."""

    def test(self) -> bool:
        if not self.done and self._poll():
            self._finish()
            self.done = True
            if self.traced is not None:
                ledger.arrived(self)
        return self.done

    def wait(self, timeout: float | None = None) -> None:
        wait_all([self], timeout if timeout is not None else self.comm.timeout)

    def describe(self) -> str:
        direction = "to" if self.kind == "send" else "from"
        return (
            f"{self.kind} of {self.nbytes} bytes {direction} rank {self.peer}"
            f"{where_is(self.comm, self.peer)} (tag {self.tag}) on group {self.comm.name}, "
            f"as rank {self.comm.rank}"
        )


def where_is(comm, peer: int) -> str:
    """' (on node1, across the link from node0)' when the world spans nodes (the node map of
    runtime/nodes.py), so that a timeout names the node it lost; '' on one node."""
    nodes = process.nodes
    if nodes is None or nodes.n_nodes < 2 or not 0 <= peer < comm.size:
        return ""
    theirs = nodes.node_of[comm.global_ranks[peer]]
    mine = nodes.node_of[comm.global_ranks[comm.rank]]
    if theirs == mine:
        return f" (on {nodes.names[theirs]}, this rank's node)"
    return f" (on {nodes.names[theirs]}, across the link from {nodes.names[mine]})"


def wait_all(requests, timeout: float, context="") -> None:
    """Wait for every request; on timeout raise CommTimeoutError naming the first one pending
    (after `context`: a string, or a function returning one, called only on a timeout).

    Polls rather than blocking inside MPI so that a wait can time out, and so that ranks sharing
    a core (oversubscribed) hand it over: after a short busy spin each poll yields CPU and GIL,
    and a wait that lasts naps between polls (pause); one for a peer on another node yields but
    never naps, as the link moves bytes only while polled (keep_moving).
    Requests that cannot be polled (gloo's point-to-point work) block with the time that is left.
    If the wait fails (a timeout, a message of the wrong size), the requests still pending are
    abandoned: see `abandon`.
    """
    requests = list(requests)
    try:
        _wait(requests, timeout, context)
    except BaseException:
        abandon(requests)
        if requests:
            requests[0].comm._told = True  # the program saw this group fail (comm/guards/ending.py)
        raise


def abandon(requests) -> None:
    """Give up on the pending requests: cancel what the transport can cancel, and keep every one
    (and so its buffer) alive for the life of the process (`process.abandoned`, minipar.state).
    The transport may still write into a receive buffer or read a send buffer; freeing it under
    MPI's feet corrupts the heap."""
    for request in requests:
        if not request.done:
            request._cancel()
            process.abandoned.append(request)


def _wait(requests, timeout: float, context) -> None:
    start = time.monotonic()
    pending = [r for r in requests if not r.test()]
    if not pending:
        return  # the common case for small messages: done at the first poll
    blocking = [r for r in pending if r.blocking]
    pending = [r for r in pending if not r.blocking]
    comm = requests[0].comm
    spin, nap = patience()
    stall = None  # once the wait lasts: the transport's look at what the peers are doing
    try:
        while pending:
            pending = [r for r in pending if not r.test()]
            if not pending:
                break
            failure = getattr(comm, "_failure", None)  # a mismatch found on this group
            if failure is not None:
                raise MismatchError(failure)
            elapsed = time.monotonic() - start
            if elapsed > timeout:
                raise _timeout(pending[0], timeout, context, stall)
            if elapsed > spin:  # a long stall polls less, leaving the core to the others
                if stall is not None:
                    stall.poll(pending, elapsed)  # may ask the peers, and fail the group
                elif elapsed > STALL_AFTER:
                    stall = comm._stall(pending) or _NO_STALL
                if crosses_nodes(pending):  # the link moves only while polled
                    keep_moving(nap)
                else:
                    time.sleep(pause(elapsed, nap))
    finally:
        if stall is not None:
            stall.close()
    if blocking:  # gloo's work (torch transport); MPI's requests are all polled above
        _wait_blocking(blocking, timeout, start, context)


class _NoStall:
    """What a transport that cannot ask its peers returns (the wait just goes on)."""

    def poll(self, pending, elapsed: float) -> None:
        pass

    def close(self) -> None:
        pass


_NO_STALL = _NoStall()


def _wait_blocking(blocking, timeout: float, start: float, context) -> None:
    for request in blocking:
        left = timeout - (time.monotonic() - start)
        if not request._block(max(left, 1e-3)):
            raise _timeout(request, timeout, context)
        request._finish()
        request.done = True
        if request.traced is not None:
            ledger.arrived(request)


def _timeout(request, timeout: float, context, stall=None) -> CommTimeoutError:
    context = context() if callable(context) else context  # a callable: built only when needed
    where = f"{context}: " if context else ""
    peer = request.comm._peer_state(request, stall)  # what the peer is doing, if it can be asked
    error = CommTimeoutError(
        f"{where}timed out after {timeout:g} s waiting for {request.describe()}"
        + (f"; {peer}" if peer else "")
    )
    error.request = request  # what a transport may inspect to explain the timeout
    return error


class Communicator:
    """A group of ranks that can message each other. Transports implement the `_i*` methods."""

    backend = "none"
    tag_ub = (1 << 31) - 1  # the largest tag the transport accepts (MPI asks MPI_TAG_UB)

    def __init__(self, rank: int, size: int, name: str, timeout: float, global_ranks, gid="w"):
        self.rank, self.size, self.name, self.timeout = rank, size, name, timeout
        self.global_ranks = list(global_ranks)  # the world rank of each rank of this group
        # the group's identity, the same on every member: "w" for the world, then the parent's
        # id and the number of its split ("w.3"); every rank splits a parent in the same order
        self.gid, self._splits = gid, 0
        self._seq = 0
        self._history = 0  # the chained hash of every call's signature so far (the tag carries it)
        self._tags = TagLayout(self.tag_ub)
        self._tag_base, self._hash_bits = self._tags.base, self._tags.hash_bits
        self._hash_mask = self._tags.hash_mask
        # (seq, signature, history) of each recent call, by sequence number modulo 2^12: what
        # the watchdog compares a peer's foreign tag (and a peer's notice) against
        self._calls: list = [None] * (SEQ_MASK + 1)
        self._failure: str | None = None  # set once a mismatch is found: every later wait raises
        self._told = False  # an error on this group reached the program (comm/guards/ending.py)
        process.groups[gid] = weakref.ref(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} rank {self.rank} of {self.size}>"

    # -- point to point -------------------------------------------------------------------
    def isend(self, buf, dst: int, tag: int = 0) -> Request:
        """Start sending all of `buf` to rank `dst` of this group."""
        self._check_peer(dst, "dst")
        self._check_tag(tag)
        buffers.check(buf, "send buffer")
        ledger.record(self, "p2p", "p2p", -1, 0, "send", dst, buffers.nbytes(buf), tag)
        return self._post_send(buf, dst, tag)

    def irecv(self, buf, src: int, tag: int = 0) -> Request:
        """Start receiving exactly `nbytes(buf)` bytes from rank `src` into `buf`."""
        self._check_peer(src, "src")
        self._check_tag(tag)
        buffers.check(buf, "receive buffer", writable=True)
        message = ledger.record(self, "p2p", "p2p", -1, 0, "recv", src, buffers.nbytes(buf), tag)
        request = self._post_recv(buf, src, tag)
        if message is not None:
            request.traced = message.clock
        return request

    def send(self, buf, dst: int, tag: int = 0) -> None:
        self.isend(buf, dst, tag).wait()

    def recv(self, buf, src: int, tag: int = 0) -> None:
        self.irecv(buf, src, tag).wait()

    def sendrecv(self, sendbuf, dst: int, recvbuf, src: int, tag: int = 0) -> None:
        """Send to `dst` and receive from `src` at once (both posted before either waits)."""
        reqs = [self.irecv(recvbuf, src, tag), self.isend(sendbuf, dst, tag)]
        wait_all(reqs, self.timeout)

    def barrier(self) -> None:
        """The transport's own barrier (MPI_Ibarrier, or torch's), bounded by the timeout.

        `minipar.barrier()` is the hand-written dissemination barrier in collectives/barrier.py.
        """
        wait_all([self._post_barrier()], self.timeout, f"barrier on group {self.name}")

    def barrier_asleep(self, nap: float = 1e-3) -> None:
        """The transport's barrier, waited for asleep: `nap` seconds between polls from the
        first, bounded by the timeout. For ranks with nothing to do while others are timed: a
        wait that spins or yields still takes turns on the cores the timed ranks need."""
        request = self._post_barrier()
        deadline = time.monotonic() + (0.0 if request.blocking else self.timeout)
        while time.monotonic() < deadline and not request.test():
            time.sleep(nap)
        left = max(deadline - time.monotonic(), 0.0) if not request.blocking else self.timeout
        wait_all([request], left, f"barrier on group {self.name}")  # done, or the timeout's error

    # -- collectives bookkeeping --------------------------------------------------------
    def next_collective_tag(self, sig, sig_hash=None) -> tuple[int, int]:
        """(sequence number, tag) for the next collective call on this group, whose signature
        (comm/trace/signature.py) is `sig` (`sig_hash` its tag_hash, if the caller kept it); raises
        MismatchError once the group has seen a mismatch.

        The tag's hash bits are the group's history: the signature's hash chained onto the
        history before it (h = h * M xor hash, modulo 2^H, one-to-one in h), so two ranks that
        disagreed about an earlier call, even one where every rank returned without receiving
        anything (both "roots" of a broadcast only send), disagree on every later tag too: the
        next call cannot match, and waits until the watchdog names the call that differed."""
        if self._failure is not None:
            self._told = True
            raise MismatchError(self._failure)
        seq = self._seq
        self._seq = seq + 1
        if sig_hash is None:
            sig_hash = _cached_hash(sig)  # inline, not signature.tag_hash: every call comes here
        if sig_hash is None:
            sig_hash = signature.tag_hash(sig)
        # HISTORY_MULTIPLIER (2531) and SEQ_MASK (4095) written out: a global's lookup is a
        # hundredth of an 8-byte all-reduce
        history = self._history = (self._history * 2531 ^ sig_hash) & self._hash_mask
        field = seq & 4095
        self._calls[field] = (seq, sig, history)
        return seq, self._tag_base + (field << self._hash_bits) + history

    def recent_calls(self, upto: int, count: int = 16) -> list:
        """(seq, signature in plain values, history) of this rank's calls #upto-count+1 ..
        #upto on this group that its table still holds: what ranks compare to find the first
        call where they parted (comm/trace/signature.py first_difference)."""
        out = []
        for seq in range(max(0, upto - count + 1), min(upto, self._seq - 1) + 1):
            entry = self._calls[seq & SEQ_MASK]
            if entry is not None and entry[0] == seq:
                out.append((seq, signature.normal(entry[1], self.size), entry[2]))
        return out

    def child_gid(self) -> str:
        """The id of the next group split from this one (every member counts its splits)."""
        self._splits += 1
        return f"{self.gid}.{self._splits}"

    def _stall(self, pending):
        """A wait on this group has lasted STALL_AFTER seconds: an object whose poll() may ask
        the peers what they are doing (comm/guards/stall.py), or None where the transport cannot."""
        return None

    def _peer_state(self, request, stall) -> str:
        """What the peer of a timed-out request is doing, in words, if it can be asked."""
        return ""

    def explain_timeout(self, call, error: CommTimeoutError) -> BaseException:
        """What to raise when a collective call timed out: the timeout itself by default; a
        transport that can ask the peer what it was doing may return a MismatchError."""
        return error

    # -- checks -----------------------------------------------------------------------------
    def _check_peer(self, peer, what: str) -> None:
        if not isinstance(peer, int) or isinstance(peer, bool) or not 0 <= peer < self.size:
            raise ValueError(
                f"{what} rank {peer!r} is out of range for group {self.name} of world size "
                f"{self.size} (valid: 0..{self.size - 1})"
            )

    def _check_tag(self, tag) -> None:
        if not isinstance(tag, int) or isinstance(tag, bool) or not 0 <= tag < COLLECTIVE_TAG_BASE:
            raise ValueError(f"tag {tag!r} must be an int in [0, {COLLECTIVE_TAG_BASE})")

    # -- what each transport implements -------------------------------------------------
    def _post_send(self, buf, dst: int, tag: int) -> Request:  # pragma: no cover
        raise NotImplementedError

    def _post_recv(self, buf, src: int, tag: int) -> Request:  # pragma: no cover
        raise NotImplementedError

    def _post_recv_any(self, buf, tag: int) -> Request:  # pragma: no cover
        """Start receiving from whichever rank's message on `tag` comes first (torch's
        `recv(src=None)`); once complete, the request's `peer` is the sender's rank."""
        raise NotImplementedError

    def _post_barrier(self) -> Request:  # pragma: no cover
        raise NotImplementedError

    def allgather_object(self, obj, context: str = "") -> list:  # pragma: no cover
        """Control plane: every rank's small picklable object, in rank order, within the timeout
        (`context` opens the timeout's message: what the all-gather was for)."""
        raise NotImplementedError

    def split(self, ranks, name: str | None = None):  # pragma: no cover
        """Collective over this group: a Communicator for the members of `ranks`, NonMember else."""
        raise NotImplementedError

    def abort(self, code: int = 1) -> None:  # pragma: no cover
        raise NotImplementedError


def check_ranks(ranks, size: int) -> list[int]:
    """Validate a new group's rank list against the parent's size."""
    ranks = list(ranks)
    for r in ranks:
        if not isinstance(r, int) or not 0 <= r < size:
            raise ValueError(f"group rank {r!r} is out of range for world size {size}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"group ranks {ranks} contain duplicates")
    if not ranks:
        raise ValueError("a group needs at least one rank")
    return ranks


class NonMember:
    """What `new_group(ranks)` gives a rank that is not in `ranks`; any use raises."""

    def __init__(self, ranks, rank: int):
        self.ranks, self.caller = list(ranks), rank
        self.name = f"group{self.ranks}"

    def __getattr__(self, attr):
        raise MiniparError(  # the same words on every non-member (the rank is in the prefix)
            f"the calling rank is not a member of group {self.ranks}; "
            f"only its members may use it (tried .{attr})"
        )

    def __repr__(self) -> str:
        return f"<NonMember of group {self.ranks} (rank {self.caller})>"
