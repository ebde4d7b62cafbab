"""The MPI watchdog: a thread that finds ranks disagreeing about a collective call, off its path.

Every collective message's tag carries the call's sequence number on its group and a hash of its
signature (base.TagLayout, signature.py). When ranks disagree (another root, op, dtype, count,
collective), their messages carry different tags and never match: nothing wrong is computed,
but someone would wait for the timeout, or, when the disagreeing ranks only send (two ranks that
both think they are the broadcast's root), everybody returns and the messages sit unreceived.
Like ProcessGroupNCCL's watchdog, one thread per process looks every PERIOD seconds, on each
group this process is in:

    1. MPI_Iprobe(peer, ANY_TAG) for each peer: the oldest message from it not yet received.
       A collective tag whose sequence number is one of this rank's recent calls but whose hash
       bits (the call's signature chained with the group's history, base.next_collective_tag)
       are not that call's means the peer made another call there, or another call before it.
    2. Suspicion -> a notice to that peer on NOTICE_TAG (comm/guards/notices.py): ("call", seq, my
       calls up to #seq: signature and history of each of the last few).
    3. A rank receiving it compares with its own calls (full numbers, from its table of recent
       signatures): where they part, the mismatch is certain. It fails the group (every later
       wait on it raises MismatchError naming both calls of the first one that differs) and
       sends ("abort", text) to every other rank of the group, which fail it with the same text.

So every rank raises within about three periods (suspicion, confirmation, abort), wherever it
is waiting, or at its next call on that group (whose tags, carrying the history, no longer
match: it waits until the abort comes); one that never calls minipar again hears of it when the
ranks compare their groups at the end (comm/guards/ending.py). Nothing is sent unless a tag
disagrees or a wait lasts, and a call pays only for hashing its signature. The same thread answers
the questions of a peer whose wait has lasted (("query", ...), comm/guards/stall.py) and takes the
answers that came after the wait that asked had ended. A message from a peer more than 2048 calls
ahead can look like a recent one (sequence numbers wrap at 4096): its notice is then harmless, since
the peer's call #seq is checked by full number.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref

from minipar.comm.guards import stall
from minipar.comm.guards.notices import fail, send
from minipar.comm.trace import signature
from minipar.comm.transport.base import NOTICE_TAG, REPLY_TAG_BASE, REPLY_TAGS, SEQ_BITS
from minipar.state import process

__all__ = ["Watchdog", "fail", "look", "oldest", "send", "shutdown", "watch"]

PERIOD = 0.1  # seconds between looks; a mismatch is reported within about 3 of them
WINDOW = 1 << (SEQ_BITS - 1)  # a tag's sequence number counts as "recent" this far back


class Watchdog:
    def __init__(self):
        self.comms: weakref.WeakSet = weakref.WeakSet()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="minipar-watchdog", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(PERIOD):
            with self.lock:
                comms = list(self.comms)
            for comm in comms:
                if comm._failure is None and not self.stop.is_set():
                    try:
                        look(comm)
                    except Exception as error:  # noqa: BLE001  (never kill the thread)
                        comm._watchdog_error = error

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def watch(comm) -> None:
    """Have the process's watchdog (minipar.state: `process.watchdog`) look after this MPI
    group; it starts with the first group of 2+ ranks."""
    if comm.size < 2:
        return
    if process.watchdog is None:
        process.watchdog = Watchdog()
        atexit.register(shutdown)  # registered after mpi4py's, so it runs before MPI_Finalize
    with process.watchdog.lock:
        process.watchdog.comms.add(comm)


def shutdown() -> None:
    """Stop the thread (minipar.finalize, and at exit before MPI is finalized)."""
    if process.watchdog is not None:
        dog, process.watchdog = process.watchdog, None
        dog.close()


def look(comm) -> None:
    """One look at one group: read the notices, take late answers, then probe each peer's
    oldest message."""
    from mpi4py import MPI

    status = MPI.Status()
    while comm.mpi.Iprobe(MPI.ANY_SOURCE, NOTICE_TAG, status):
        notice = comm.mpi.recv(source=status.Get_source(), tag=NOTICE_TAG)
        _on_notice(comm, status.Get_source(), notice)
        if comm._failure is not None:
            return
    if comm._late:
        take_late(comm)
    if len(comm._notices) > 32:
        prune(comm)
    for peer, tag in oldest(comm, status):
        _check_tag(comm, peer, tag)


def prune(comm) -> None:
    """Forget the notices, questions and answers MPI has sent (only this thread removes any:
    one still in flight must stay referenced, or its buffer would be freed under MPI)."""
    for request in [r for r in list(comm._notices) if r.Test()]:
        comm._notices.remove(request)


def take_late(comm, limit: float = stall.LATE_LIMIT) -> None:
    """Receive the answers to questions whose wait ended before they came (an unreceived message
    would fail MPI_Finalize); forget those older than `limit` seconds."""
    late, comm._late = comm._late, []
    now = time.monotonic()
    for peer, tag, when in late:
        if comm.mpi.Iprobe(peer, tag):
            comm.mpi.recv(source=peer, tag=tag)
        elif now - when < limit:
            comm._late.append((peer, tag, when))


def oldest(comm, status) -> list[tuple[int, int]]:
    """(peer, tag) of the oldest message from each peer that nobody has received yet
    (MPI_Iprobe; `status` is filled along the way)."""
    from mpi4py import MPI

    found = []
    for peer in range(comm.size):
        if peer != comm.rank and comm.mpi.Iprobe(peer, MPI.ANY_TAG, status):
            found.append((peer, status.Get_tag()))
    return found


def _recent_call(comm, field: int):
    """This rank's call whose sequence number is `field` modulo 2^12, if it is one of the last
    WINDOW calls it started (a larger field is a call still to come: a peer ahead of us)."""
    entry = comm._calls[field]
    if entry is None or not 0 <= comm._seq - 1 - entry[0] < WINDOW:
        return None
    return entry


def _check_tag(comm, peer: int, tag: int) -> None:
    decoded = comm._tags.decode(tag)
    if decoded is None:
        return  # a user message, or a control one
    field, peer_hash = decoded
    entry = _recent_call(comm, field)
    if entry is None or entry[2] == peer_hash:
        return  # a call to come, or this very call (its receive is not posted yet)
    seq = entry[0]
    if (peer, seq) not in comm._asked:
        comm._asked.add((peer, seq))
        send(comm, peer, ("call", seq, comm.recent_calls(seq)))


def _on_notice(comm, peer: int, notice) -> None:
    if notice[0] == "abort":
        fail(comm, notice[1], tell_others=False)
        return
    if notice[0] == "query":  # a peer stalled in a call asks which call this rank is in
        _, qid, seq = notice
        send(comm, peer, stall.answer(comm, seq), tag=REPLY_TAG_BASE + qid % REPLY_TAGS)
        return
    _, seq, theirs = notice
    entry = comm._calls[seq % (1 << SEQ_BITS)]
    if entry is None or entry[0] != seq:
        return  # not a call of this rank's recent past (the peer is far ahead): nothing to say
    found = signature.first_difference(comm.recent_calls(seq), theirs)
    if found is not None:  # None: no disagreement after all
        fail(comm, signature.difference_text(comm.name, found, comm.rank, peer))
