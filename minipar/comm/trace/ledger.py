"""The trace ledger: every message this rank sends or receives, with the step it belongs to.

    with minipar.trace() as t:
        minipar.all_reduce(x, algorithm="ring")
    t.bytes_sent()      # 2 (p-1)/p * n for the ring
    t.steps             # 2 (p-1)
    t.calls[0].algorithm
    t.bytes_sent(link="inter")   # of those, the bytes sent to ranks on other nodes

Each rank keeps its own ledger (nothing is sent to record it). A *step* is one round of an
algorithm: the messages a rank posts before it must wait for the previous round's. Tests check
the ledger against the formulas in each algorithm's docstring and in `minipar.cost`, so an
algorithm that computes the right answer the wrong way (too many bytes, extra rounds) fails.

The ledger also keeps time, for the timeline (comm/trace/chrome_trace.py: `t.save("x.json")` opens
in Perfetto): when each message was posted and each receive completed (`Message.clock`), when each
collective call ran and on which thread (`Call.start`, `.end`), the spans the strategies mark
(`span(name, cat)`: a pipeline instruction, an FSDP unit's forward, a DDP bucket's wait) and
counter values (`counter(name, value)`: the saved activation bytes). Every clock is
time.perf_counter(). Nothing of it runs while no trace is open: `span` hands back one shared
do-nothing context, and the transports look at `process.traces` before anything else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from dataclasses import dataclass, field

from minipar.comm.trace import chrome_trace
from minipar.state import process

now = time.perf_counter  # the ledger's clock


@dataclass
class Clock:
    """When a message was posted and, for a receive, when it completed (perf_counter seconds),
    on which threads; `peer`: a receive from any rank's sender, once known."""

    posted: float
    thread: int
    done: float | None = None
    done_thread: int | None = None
    peer: int | None = None


@dataclass(frozen=True)
class Message:
    group: str
    rank: int  # this rank, in the group's numbering
    collective: str  # "all_reduce", ... or "p2p" for a user's own send/recv
    algorithm: str
    seq: int  # the group's collective sequence number (-1 for p2p)
    step: int
    kind: str  # "send" or "recv"
    peer: int  # the other rank, in the group's numbering
    nbytes: int
    # how the bytes crossed: "host" (CPU memory), or for a CUDA buffer on MPI "direct"
    # (CUDA-aware), "staged" (one pinned-host copy each way) or "staged-pipelined" (chunked);
    # inside a node's shared windows (collectives/fast/windows.py) "shm" (copied into the
    # sender's segment, read there by the receiver) or "shm-in-place" (read by the receiver
    # straight out of the sender's own buffer, which lives in a window:
    # comm/transport/shm_buffers.py)
    path: str = "host"
    tag: int = -1  # a point-to-point message's tag (a collective's messages: its seq says which)
    # whether the peer runs on another node (the world's node map, runtime/nodes.py): the
    # message crossed the link between nodes, not memory or NVLink inside one
    between_nodes: bool = False
    clock: Clock | None = field(default=None, compare=False, repr=False)


@dataclass
class Call:
    """One collective call as this rank saw it (start, end: when it ran, on `thread`)."""

    group: str
    collective: str
    algorithm: str
    seq: int
    messages: list = field(default_factory=list)
    start: float | None = None
    end: float | None = None
    thread: int | None = None

    @property
    def steps(self) -> int:
        return 1 + max((m.step for m in self.messages), default=-1)

    @property
    def bytes_sent(self) -> int:
        return sum(m.nbytes for m in self.messages if m.kind == "send")

    @property
    def bytes_received(self) -> int:
        return sum(m.nbytes for m in self.messages if m.kind == "recv")

    @property
    def bytes_between_nodes(self) -> int:
        """Bytes this rank sent to ranks on other nodes in this call."""
        return sum(m.nbytes for m in self.messages if m.kind == "send" and m.between_nodes)


LINKS = (None, "intra", "inter")  # every message; those inside a node; those between nodes


class Trace:
    """The ledger of one `with minipar.trace()` block on this rank."""

    def __init__(self):
        self.messages: list[Message] = []
        self.calls: list[Call] = []
        self._open: dict = {}
        self.spans: list[Span] = []
        self.counters: list[tuple] = []  # (time, name, value)
        self.groups: dict[str, list[int]] = {}  # group name -> its ranks' global ranks
        self.threads: dict[int, str] = {}  # thread ident -> name
        self.opened = now()

    def _begin(self, group: str, collective: str, algorithm: str, seq: int) -> None:
        call = Call(group, collective, algorithm, seq)
        self.calls.append(call)
        self._open[(group, seq)] = call

    def align(self, group=None) -> tuple[float, float]:
        """Collective over `group` (default the world): measure now what to add to this rank's
        clock to read rank 0's, and the error bound (comm/chrome_trace.clock_offset); `save`
        uses it. (offset, error) in seconds."""
        comm = group if group is not None else process.world
        self.clock = chrome_trace.clock_offset(comm) if comm is not None else (0.0, 0.0)
        return self.clock

    def save(self, path: str, group=None) -> str | None:
        """Write every rank's part of this trace as one Chrome trace-event JSON file (Perfetto,
        chrome://tracing), clocks aligned: collective over `group` (default the world), rank 0
        writes `path`; see comm/trace/chrome_trace.py. Returns the path on the writing rank."""
        return chrome_trace.save(self, path, group)

    def _add(self, message: Message) -> None:
        self.messages.append(message)
        call = self._open.get((message.group, message.seq))
        if call is not None:
            call.messages.append(message)

    def _set_path(self, group: str, kind: str, peer: int, nbytes: int, path: str) -> None:
        for i in range(len(self.messages) - 1, max(len(self.messages) - 64, 0) - 1, -1):
            m = self.messages[i]
            same = (m.group, m.kind, m.nbytes, m.path) == (group, kind, nbytes, "host")
            if same and (m.peer == peer or peer == -1):
                self.messages[i] = dataclasses.replace(m, path=path)
                call = self._open.get((m.group, m.seq))
                if call is not None:
                    at = next((j for j, c in enumerate(call.messages) if c is m), None)
                    if at is not None:
                        call.messages[at] = self.messages[i]
                return

    def paths(self) -> dict:
        """{path: number of messages}: how this rank's messages crossed (see Message.path)."""
        counts: dict = {}
        for m in self.messages:
            counts[m.path] = counts.get(m.path, 0) + 1
        return counts

    def _select(self, collective, link=None):
        if link not in LINKS:
            raise ValueError(f"link={link!r}: use 'intra' (inside a node), 'inter' (between "
                             "nodes) or None (both)")  # fmt: skip
        crossing = None if link is None else link == "inter"
        return [
            m
            for m in self.messages
            if collective in (None, m.collective) and crossing in (None, m.between_nodes)
        ]

    def bytes_sent(self, collective: str | None = None, link: str | None = None) -> int:
        """Bytes this rank sent (of one collective; over one link class: "intra", "inter")."""
        return sum(m.nbytes for m in self._select(collective, link) if m.kind == "send")

    def bytes_received(self, collective: str | None = None, link: str | None = None) -> int:
        return sum(m.nbytes for m in self._select(collective, link) if m.kind == "recv")

    @property
    def steps(self) -> int:
        """Rounds this rank took part in, summed over the collective calls it made."""
        return sum(call.steps for call in self.calls)

    @property
    def algorithms(self) -> list[str]:
        return [call.algorithm for call in self.calls]

    def __repr__(self) -> str:
        return (
            f"<Trace {len(self.calls)} calls, {len(self.messages)} messages, "
            f"{self.bytes_sent()} bytes sent, {self.steps} steps>"
        )


@dataclass
class Span:
    """A stretch of time a strategy named: `cat` "pipeline", "fsdp", "ddp", "recompute", ..."""

    name: str
    cat: str
    start: float
    end: float
    thread: int
    args: dict


class _OpenSpan:
    """A span being timed: enter and exit (a with block), or opened now and `close()`d later."""

    __slots__ = ("name", "cat", "args", "start")

    def __init__(self, name: str, cat: str, args: dict):
        self.name, self.cat, self.args, self.start = name, cat, args, now()

    def __enter__(self):
        self.start = now()
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        thread = _thread()
        done = Span(self.name, self.cat, self.start, now(), thread, self.args)
        for ledger in process.traces:
            ledger.spans.append(done)


_NO_SPAN = contextlib.nullcontext()  # what `span` gives while nothing records (shared, stateless)


def span(name: str, cat: str = "compute", **args):
    """A with block timed as a span of every open trace; nothing at all when none is open."""
    if not process.traces:
        return _NO_SPAN
    return _OpenSpan(name, cat, args)


def open_span(name: str, cat: str = "compute", **args):
    """A span that starts now and ends at its `close()` (for a pair of hooks), or None."""
    return _OpenSpan(name, cat, args) if process.traces else None


def counter(name: str, value: float) -> None:
    """A counter track's new value (Chrome's "C" event), in every open trace."""
    if process.traces:
        sample = (now(), name, value)
        for ledger in process.traces:
            ledger.counters.append(sample)


def _thread() -> int:
    """This thread's ident, its name noted in every open trace the first time."""
    ident = threading.get_ident()
    for ledger in process.traces:
        if ident not in ledger.threads:
            ledger.threads[ident] = threading.current_thread().name
    return ident


@contextlib.contextmanager
def running(comm, seq: int):
    """Time a collective call (its Call in every open trace gets start, end and thread)."""
    if not process.traces:
        yield
        return
    start, thread = now(), _thread()
    try:
        yield
    finally:
        end = now()
        for ledger in process.traces:
            call = ledger._open.get((comm.name, seq))
            if call is not None:
                call.start, call.end, call.thread = start, end, thread


def arrived(request) -> None:
    """A traced receive completed: its clock notes when (and, from any rank, from whom)."""
    clock = request.traced
    done(clock)
    if clock.peer is None:
        clock.peer = request.peer


def done(clock: Clock) -> None:
    """A receive's clock notes that it completed, now (a window read: collectives/fast/)."""
    clock.done, clock.done_thread = now(), _thread()


@contextlib.contextmanager
def trace():
    """Record every message of this rank inside the block (nested blocks all record). The open
    ledgers are `process.traces` (minipar.state), innermost last."""
    ledger = Trace()
    process.traces.append(ledger)
    try:
        yield ledger
    finally:
        process.traces.remove(ledger)


def active() -> bool:
    return bool(process.traces)


def begin_call(comm, collective: str, algorithm: str, seq: int) -> None:
    for ledger in process.traces:
        ledger._begin(comm.name, collective, algorithm, seq)
        if comm.name not in ledger.groups:
            ledger.groups[comm.name] = list(comm.global_ranks)


def record(comm, collective, algorithm, seq, step, kind, peer, nbytes, tag=-1, path="host"):
    """Note a message in every open trace; the Message (None when none is open): a receive's
    caller hands its clock to the request (`request.traced`), which notes its completion."""
    if not process.traces:
        return None
    clock = Clock(now(), _thread())
    message = Message(
        comm.name, comm.rank, collective, algorithm, seq, step, kind, peer, nbytes, path, tag,
        _between_nodes(comm, peer), clock,
    )  # fmt: skip
    for ledger in process.traces:
        ledger._add(message)
        if comm.name not in ledger.groups:
            ledger.groups[comm.name] = list(comm.global_ranks)
    return message


def _between_nodes(comm, peer) -> bool:
    """Whether group rank `peer` runs on another node than this rank (False when unknown: no
    node map yet, or a receive from any rank)."""
    world_map = process.nodes
    if world_map is None or peer is None or peer < 0:
        return False
    ranks = comm.global_ranks
    return world_map.node_of[ranks[comm.rank]] != world_map.node_of[ranks[peer]]


def note_path(comm, kind: str, peer: int, nbytes: int, path: str) -> None:
    """The transport says how a message it was just given crosses: set `path` on the latest
    matching message of each open ledger (recorded a moment ago, by the same thread)."""
    for ledger in process.traces:
        ledger._set_path(comm.name, kind, peer, nbytes, path)


@contextlib.contextmanager
def paused():
    """Record nothing inside the block: the grader runs the reference solution here, so that the
    ledger a test reads holds the student's messages only."""
    saved = process.traces[:]
    process.traces.clear()
    try:
        yield
    finally:
        process.traces[:0] = saved
