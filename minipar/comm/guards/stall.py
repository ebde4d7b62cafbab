"""A collective wait that lasts: ask the peers which call they are in, and name the mismatch that
no tag shows (MPI transport).

The watchdog (comm/guards/watchdog.py) sees a mismatch when a peer's message carries a foreign tag.
Some mismatches send nothing at all: ranks that disagree on reduce's `dst` all wait to receive and
none sends; ranks that call the same collective on two different groups each wait on a group the
other never calls. So a wait inside a collective that has lasted `process.mismatch_after` seconds
(about a second: minipar.init(mismatch_after=), MINIPAR_MISMATCH_AFTER) asks each peer it waits
for, on the notice tag (comm/guards/notices.py), which call it is in. The peer's watchdog answers
within a period, on a reply tag of this question's own (REPLY_TAG_BASE + question number), with:

    its next call number on the group, its recent calls up to the asked one (signature, history),
    the waits it is stuck in (group id and name, call number, signature, peers, for how long),
    whether every thread of it that can call minipar is stuck in one, whether it is at its end

and the asking rank decides:

- the peer made the same call number with another signature, or after another history: the
  first call where they part is named (MismatchError on every rank of the group);
- the peer has not made it and is at its end (finalize() or exit): it never will;
- the peer has not made it, is stuck in call #t on another group h of which the asking rank is a
  member and whose call #t it has not made, and both processes are stuck in every thread that can
  call minipar: neither can ever reach the other's call (the same collective on two groups, or
  overlapping groups called in different orders): both calls and groups are named, and both
  groups fail;
- anything else (the peer is slower, computing, or waiting for a third rank) proves nothing: the
  peer is asked again every ASK_AGAIN seconds, and its last answer goes into the timeout's message.

Every wait longer than STALL_AFTER is registered in `process.stalls` (minipar.state), which is
what a peer's question is answered from; a wait that ends sooner costs nothing. Point-to-point
waits ask nobody (MPI's semantics: a receive waits for its send), but a timed-out one asks the
peer once and says what it is doing.
"""

from __future__ import annotations

import threading
import time

from minipar.comm.guards.notices import fail, send
from minipar.comm.trace import signature
from minipar.comm.transport.base import (
    COLLECTIVE_TAG_BASE,
    CONTROL_TAG,
    REPLY_TAG_BASE,
    REPLY_TAGS,
    SEQ_MASK,
    STALL_AFTER,
)
from minipar.state import process

ASK_AGAIN = 0.25  # seconds before a peer is asked again, doubled after each answer (up to 2 s)
ANSWER_WAIT = 0.5  # seconds a timed-out wait gives its peer to say what it is doing
LATE_LIMIT = 300.0  # seconds an unanswered question's reply is still looked for (watchdog.look)


class Stall:
    """One thread's wait on one group that has lasted STALL_AFTER seconds (base._wait makes it
    and polls it; close() when the wait ends)."""

    def __init__(self, comm, pending):
        self.comm, self.request = comm, pending[0]
        self.since = time.monotonic() - STALL_AFTER
        self.kind, self.entry = kind_of(comm, self.request.tag)
        self.asked: dict = {}  # peer -> (reply tag, when asked)
        self.answers: dict = {}  # peer -> (its answer, when it came, how many came)
        self.thread = threading.get_ident()
        process.stalls[self.thread] = self

    def poll(self, pending, elapsed: float) -> None:
        """Ask the peers still awaited once the wait has lasted mismatch_after (again ASK_AGAIN
        after an answer, then twice as long each time), read the answers that came, judge them."""
        if self.entry is None:
            return  # not a collective call: nobody is asked
        now = time.monotonic()
        if elapsed >= process.mismatch_after:
            for peer in {r.peer for r in pending if r.peer >= 0}:
                got = self.answers.get(peer)
                again = got is None or now - got[1] > ASK_AGAIN * 2 ** min(got[2] - 1, 3)
                if peer not in self.asked and again:
                    self.asked[peer] = (ask(self.comm, peer, self.entry[0]), now)
        for peer, (tag, _) in list(self.asked.items()):
            if self.comm.mpi.Iprobe(peer, tag):
                answer = self.comm.mpi.recv(source=peer, tag=tag)
                del self.asked[peer]
                count = self.answers[peer][2] + 1 if peer in self.answers else 1
                self.answers[peer] = (answer, now, count)
                judge(self.comm, self.entry, peer, answer)

    def close(self) -> None:
        if process.stalls.get(self.thread) is self:
            del process.stalls[self.thread]
        for peer, (tag, when) in self.asked.items():  # the watchdog takes the answers later
            self.comm._late.append((peer, tag, when))

    def describe(self) -> dict:
        """This wait, as a peer's question is answered (plain values, picklable)."""
        comm, entry = self.comm, self.entry
        return {
            "kind": self.kind,
            "gid": comm.gid,
            "group": comm.name,
            "seq": None if entry is None else entry[0],
            "sig": None if entry is None else signature.normal(entry[1], comm.size),
            "what": self.request.describe(),
            "seconds": round(time.monotonic() - self.since, 2),
        }


class WorkWait:
    """A thread blocked in Work.wait() on an async collective, registered like a Stall (it can
    make no call until the work is done): `with WorkWait(description): ...`."""

    def __init__(self, description: str):
        self.description, self.since = description, time.monotonic()
        self.thread = threading.get_ident()

    def __enter__(self):
        process.stalls[self.thread] = self
        return self

    def __exit__(self, *exc) -> None:
        if process.stalls.get(self.thread) is self:
            del process.stalls[self.thread]

    def describe(self) -> dict:
        seconds = round(time.monotonic() - self.since, 2)
        return {"kind": "work", "gid": None, "group": None, "seq": None, "sig": None,
                "what": self.description, "seconds": seconds}  # fmt: skip


def kind_of(comm, tag: int):
    """("collective", its (seq, signature, history) entry), or (what else it is, None)."""
    if tag >= comm._tag_base:
        entry = comm._calls[comm._tags.decode(tag)[0] & SEQ_MASK]
        return "collective", entry
    if tag == CONTROL_TAG:
        return "debug check", None
    if 0 <= tag < COLLECTIVE_TAG_BASE:
        return "point-to-point", None
    return "control", None


def ask(comm, peer: int, seq) -> int:
    """Send the question ("query", qid, seq) to `peer`; returns the tag its answer will carry."""
    qid = next(comm._questions)
    send(comm, peer, ("query", qid, seq))
    return REPLY_TAG_BASE + qid % REPLY_TAGS


def answer(comm, seq) -> dict:
    """What this rank tells a peer that asks about its call #seq on `comm` (None: its state)."""
    made = seq is not None and comm._seq > seq
    ending = process.ending
    return {
        "next": comm._seq,
        "recent": comm.recent_calls(seq) if made else [],
        "last": comm.recent_calls(comm._seq - 1, 1),
        "stalls": [stall.describe() for stall in list(process.stalls.values())],
        "stuck": all_stuck(),
        "ending": None if ending is None else ending.reason,
    }


def all_stuck() -> bool:
    """Every thread of this process that can make a minipar call is blocked in a registered wait
    (the watchdog and the progress thread never make one: an async call took its number when it
    was issued)."""
    own = {getattr(process.watchdog, "thread", None), getattr(process.progress, "thread", None)}
    own_ids = {t.ident for t in own if t is not None}
    stalls = process.stalls
    return all(t.ident in stalls or t.ident in own_ids for t in threading.enumerate())


def judge(comm, entry, peer: int, theirs: dict) -> None:
    """Fail the group (and another) if the peer's answer proves a mismatch (see the module)."""
    seq, sig = entry[0], signature.normal(entry[1], comm.size)
    if theirs["next"] > seq:  # the peer made this call: the same one, after the same calls?
        found = signature.first_difference(comm.recent_calls(seq), theirs["recent"])
        if found is not None:
            fail(comm, signature.difference_text(comm.name, found, comm.rank, peer))
        return
    if theirs["ending"] is not None:
        why = f"is at the end of the job ({theirs['ending']})"
        fail(comm, signature.missing_text(comm.name, seq, comm.rank, sig, peer, why))
        return
    if not (theirs["stuck"] and all_stuck()):
        return
    for stall in theirs["stalls"]:
        other = group(stall["gid"]) if stall["kind"] == "collective" else None
        if other is None or other is comm or other._seq > stall["seq"]:
            continue  # not a group of mine, or a call I made: it may still finish
        me, them = comm.global_ranks[comm.rank], comm.global_ranks[peer]
        text = signature.groups_text(
            (me, comm.name, seq, sig), (them, stall["group"], stall["seq"], stall["sig"])
        )
        fail(comm, text)
        fail(other, text)
        return


def group(gid):
    """This rank's group of that id, if it is a member and the group is alive."""
    ref = process.groups.get(gid) if gid is not None else None
    return None if ref is None else ref()


# -- what a timed-out wait says about its peer ----------------------------------------------------
def peer_state(comm, request, stall) -> str:
    """What the peer of a timed-out request is doing, in words: its answer to this wait's last
    question if fresh, else asked now (ANSWER_WAIT seconds at most); "" when it cannot be asked."""
    peer = request.peer
    if peer is None or peer < 0 or peer == comm.rank or process.watchdog is None:
        return ""
    got = stall.answers.get(peer) if isinstance(stall, Stall) else None
    if got is not None and time.monotonic() - got[1] < 2 * ASK_AGAIN:
        return describe(comm, peer, got[0])
    entry = stall.entry if isinstance(stall, Stall) else None
    tag, start = ask(comm, peer, None if entry is None else entry[0]), time.monotonic()
    while not comm.mpi.Iprobe(peer, tag):
        if time.monotonic() - start > ANSWER_WAIT:
            comm._late.append((peer, tag, start))
            return (
                f"rank {peer} did not say what it is doing within {ANSWER_WAIT:g} s (it holds "
                "Python's lock outside minipar, or it is gone)"
            )
        time.sleep(1e-3)
    return describe(comm, peer, comm.mpi.recv(source=peer, tag=tag))


def describe(comm, peer: int, theirs: dict) -> str:
    """A peer's answer in words: 'rank 1 is waiting in all_reduce(...) (call #3 on group world)
    for 2.1 s', 'rank 1 is waiting for recv of 8 bytes from rank 0 (tag 5) on group world, as
    rank 1 (2.1 s so far)' or 'rank 1 is not waiting in minipar ...; its next call on group world
    is #4'."""
    who = f"rank {peer}"
    if theirs["ending"] is not None:
        return (
            f"{who} is at the end of the job ({theirs['ending']}), after {theirs['next']} calls "
            f"on group {comm.name}"
        )
    waits = []
    for stall in theirs["stalls"]:
        if stall["kind"] == "collective":
            call = signature.render(stall["sig"], False)
            where = f"call #{stall['seq']} on group {stall['group']}"
            waits.append(f"in {call} ({where}) for {stall['seconds']:g} s")
        else:  # a point-to-point message, a control all-gather, an async call's Work
            waits.append(f"for {stall['what']} ({stall['seconds']:g} s so far)")
    if waits:
        return f"{who} is waiting " + "; and ".join(waits)
    return (
        f"{who} is not waiting in minipar (it computes, or is between calls); its next call on "
        f"group {comm.name} is #{theirs['next']}"
    )
