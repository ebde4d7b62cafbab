"""The end of a job: the ranks compare what each group saw, so no mismatch leaves silently.

A mismatch in a call where every rank returned without receiving anything (both "roots" of a
broadcast only send; every "root" of a scatter keeps its own piece) leaves messages that nobody
receives. The group's next call cannot match (its tags carry the history, base.py), and the
watchdog names the call that differed; but a program may make no next call. So at finalize() and
at exit (comm/guards/leaving.py) every rank sends every other, in one control all-gather on the
world, what each of its groups saw:

    (group id, name, world ranks, this rank's place, calls made, their chained history,
     "told" / a failure nobody raised / None, the last RECENT calls' signatures)

Every rank reads the same table, and for each group it is a member of on which no member was
told of an error (a MismatchError, CommTimeoutError or MessageSizeError that reached the program,
which then chose what to do), finds the same verdict: a failure the watchdog found but no wait
raised, or two members whose numbers of calls or histories differ (the first call where they
part is named). finalize() then raises MismatchError on every member; at exit each member prints
it and ends with status 1, so a job that ends this way never ends with status 0.

While the ranks wait for each other here, the watchdog still runs: a peer stalled in a call this
rank never made asks, hears that this rank is at its end, and fails the group, which stops this
comparison too (comm/guards/notices.py): both sides raise. A rank that does not come within the
world's timeout is not waited for longer: the comparison is skipped, saying so.
"""

from __future__ import annotations

import pickle
import sys
import time

import numpy as np

from minipar.comm.trace import signature
from minipar.errors import CommTimeoutError, MiniparError, MismatchError
from minipar.state import process

RECENT = 16  # calls per group whose signatures travel, to name the one where ranks part


class Ending:
    """`process.ending` while the comparison runs: why (shown to a peer that asks), and the
    failure that stopped it, if one came (notices.fail sets it)."""

    def __init__(self, world, reason: str):
        self.world, self.reason, self.interrupt = world, reason, None


def check(world, reason: str) -> list[str] | None:
    """Compare every group's calls with the other ranks (`reason`: "finalize()" or "exit"):
    the MismatchError texts of this rank's groups ([] when all agree), or None when the
    comparison could not run (a rank did not come, or the control channel is spent)."""
    world._ended = True
    if world.size < 2:
        return []
    process.ending = Ending(world, reason)
    try:
        table = gather(world, [summary(comm) for comm in live_groups()], reason)
    except MismatchError as error:
        return [str(error)]
    except (CommTimeoutError, MiniparError) as error:
        me = world.global_ranks[world.rank]
        sys.stderr.write(f"[rank {me}] minipar: the ranks' calls were not compared at "
                         f"{reason}: {error}\n")  # fmt: skip
        return None
    finally:
        process.ending = None
    return verdicts(table, world.global_ranks[world.rank])


def live_groups() -> list:
    """This rank's groups of two ranks or more that are still alive."""
    comms = (ref() for ref in list(process.groups.values()))
    return [c for c in comms if c is not None and c.size > 1]


def summary(comm) -> tuple:
    """What this rank tells the others about one group (plain values, picklable)."""
    state = "told" if comm._told else comm._failure
    recent = comm.recent_calls(comm._seq - 1, RECENT)
    return (comm.gid, comm.name, list(comm.global_ranks), comm.rank, comm._seq, comm._history,
            state, recent)  # fmt: skip


def gather(world, mine, reason: str) -> list:
    """Every rank's summaries, in world-rank order, within the world's timeout."""
    context = f"comparing every group's calls at {reason}"
    if world.backend != "mpi":
        return world.allgather_object(mine, context)
    world._control_usable()  # raises if an earlier control all-gather is still pending
    from mpi4py import MPI  # loaded already: an MPI world exists

    deadline = time.monotonic() + world.timeout
    data = np.frombuffer(pickle.dumps(mine), dtype=np.uint8)
    sizes = np.zeros(world.size, dtype=np.int64)
    one = np.array([data.size], dtype=np.int64)
    _poll(world, world.mpi.Iallgather([one, MPI.INT64_T], sizes), deadline, context)
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    _poll(world, world.mpi.Iallgatherv([data, MPI.BYTE], [out, (sizes, None), MPI.BYTE]),
          deadline, context)  # fmt: skip
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [pickle.loads(out[a:b].tobytes()) for a, b in zip(bounds[:-1], bounds[1:])]


def _poll(world, request, deadline: float, context: str) -> None:
    """Until the control all-gather is done; a failure found meanwhile (notices.fail) stops it,
    as does the deadline (the all-gather is then left pending: the channel is spent)."""
    while not request.Test():
        if process.ending.interrupt is not None:
            world._control_spent = f"{context} was interrupted"
            raise MismatchError(process.ending.interrupt)
        if time.monotonic() > deadline:
            world._control_spent = f"{context} timed out"
            raise CommTimeoutError(
                f"{context}: timed out after {world.timeout:g} s waiting for the other ranks of "
                f"group {world.name} to reach it"
            )
        time.sleep(1e-3)


def verdicts(table, me: int) -> list[str]:
    """The MismatchError texts of the groups world rank `me` is in (the same on every member)."""
    seen: dict = {}
    for entries in table:
        for entry in entries:
            seen.setdefault(entry[0], []).append(entry)
    texts = []
    for entries in seen.values():
        if len(entries) < 2 or me not in entries[0][2]:
            continue
        states = [entry[6] for entry in entries]
        if "told" in states:
            continue  # the program heard of this group's error and chose what to do
        failures = [state for state in states if state]
        if failures:
            texts.append(failures[0])  # found by the watchdog after every wait had ended
            continue
        first = entries[0]
        for other in entries[1:]:
            if (first[4], first[5]) != (other[4], other[5]):
                texts.append(difference(first, other))
                break
    return texts


def difference(a, b) -> str:
    """The text for two members' summaries whose calls differ: the first call where they part,
    or the call one made and the other never did."""
    name = a[1]
    if a[4] < b[4]:
        a, b = b, a  # a made more calls (or as many)
    found = signature.first_difference(
        [c for c in a[7] if c[0] < b[4]], [c for c in b[7] if c[0] < b[4]]
    )
    if found is not None:
        return signature.difference_text(name, found, a[3], b[3])
    if a[4] == b[4]:
        return signature.history_text(name, a[4] - 1, a[3], b[3])
    extra = [c for c in a[7] if c[0] == b[4]]
    if not extra:
        return signature.history_text(name, b[4], a[3], b[3])
    why = f"reached the end of the job after {b[4]} calls on it"
    return signature.missing_text(name, b[4], a[3], extra[0][1], b[3], why)


def report(world, texts, reason: str, ends: bool = True) -> None:
    """Print this rank's verdicts, each as the error it is, with the rank (finalize() raises
    after, at a point where the rank is no longer known; `ends`: the exit's last words)."""
    me = world.global_ranks[world.rank]
    for text in texts:
        sys.stderr.write(f"[rank {me}] minipar.errors.MismatchError (found at {reason}): {text}\n")
    if ends:
        sys.stderr.write(f"[rank {me}] minipar: the job made mismatched calls; ending it with "
                         "status 1\n")  # fmt: skip
    sys.stderr.flush()
