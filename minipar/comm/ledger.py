"""The trace ledger: every message this rank sends or receives, with the step it belongs to.

    with minipar.trace() as t:
        minipar.all_reduce(x, algorithm="ring")
    t.bytes_sent()      # 2 (p-1)/p * n for the ring
    t.steps             # 2 (p-1)
    t.calls[0].algorithm

Each rank keeps its own ledger (nothing is sent to record it). A *step* is one round of an
algorithm: the messages a rank posts before it must wait for the previous round's. Tests check
the ledger against the formulas in each algorithm's docstring and in `minipar.cost`, so an
algorithm that computes the right answer the wrong way (too many bytes, extra rounds) fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

from minipar.state import process


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
    # straight out of the sender's own buffer, which lives in a window: comm/shm_buffers.py)
    path: str = "host"


@dataclass
class Call:
    """One collective call as this rank saw it."""

    group: str
    collective: str
    algorithm: str
    seq: int
    messages: list = field(default_factory=list)

    @property
    def steps(self) -> int:
        return 1 + max((m.step for m in self.messages), default=-1)

    @property
    def bytes_sent(self) -> int:
        return sum(m.nbytes for m in self.messages if m.kind == "send")

    @property
    def bytes_received(self) -> int:
        return sum(m.nbytes for m in self.messages if m.kind == "recv")


class Trace:
    """The ledger of one `with minipar.trace()` block on this rank."""

    def __init__(self):
        self.messages: list[Message] = []
        self.calls: list[Call] = []
        self._open: dict = {}

    def _begin(self, group: str, collective: str, algorithm: str, seq: int) -> None:
        call = Call(group, collective, algorithm, seq)
        self.calls.append(call)
        self._open[(group, seq)] = call

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

    def _select(self, collective):
        return [m for m in self.messages if collective in (None, m.collective)]

    def bytes_sent(self, collective: str | None = None) -> int:
        return sum(m.nbytes for m in self._select(collective) if m.kind == "send")

    def bytes_received(self, collective: str | None = None) -> int:
        return sum(m.nbytes for m in self._select(collective) if m.kind == "recv")

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


def record(comm, collective, algorithm, seq, step, kind, peer, nbytes, path="host") -> None:
    if process.traces:
        message = Message(
            comm.name, comm.rank, collective, algorithm, seq, step, kind, peer, nbytes, path
        )
        for ledger in process.traces:
            ledger._add(message)


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
