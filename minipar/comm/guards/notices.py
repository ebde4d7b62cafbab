"""The control messages between ranks about a mismatch: small pickled notices, and failing a group.

Ranks that find a mismatch (the watchdog, comm/guards/watchdog.py, from a foreign tag; a stalled
wait, guards/stall.py, from a peer's answer) tell each other on NOTICE_TAG, a tag no data ever uses:

    ("call", seq, recent calls)   "my call #seq and the calls before it: is yours the same?"
    ("query", qid, seq)           "which call are you in?" (answered on its own reply tag)
    ("abort", text)               "this group failed: raise MismatchError(text)"

`fail` marks a group failed on this rank (every later wait on it raises MismatchError) and sends
("abort", text) to its other ranks. While this rank compares its groups at the end of the job
(comm/guards/ending.py), a failure also stops that comparison, which then reports it.
"""

from __future__ import annotations

from minipar.comm.transport.base import NOTICE_TAG
from minipar.state import process


def send(comm, peer: int, notice, tag: int = NOTICE_TAG) -> None:
    """A small pickled control message, nonblocking; the request (and so its buffer) is kept
    until MPI has sent it (watchdog.prune): a handful per mismatch or question, none otherwise."""
    comm._notices.append(comm.mpi.isend(notice, dest=peer, tag=tag))


def fail(comm, text: str, tell_others: bool = True) -> None:
    """Mark the group failed (its waits raise MismatchError(text)) and tell the other ranks."""
    if comm._failure is not None:
        return
    comm._failure = text
    if tell_others:
        for q in range(comm.size):
            if q != comm.rank:
                send(comm, q, ("abort", text))
    ending = process.ending
    if ending is not None and ending.interrupt is None:
        ending.interrupt = text  # the end-of-job comparison waits no longer: it reports this
