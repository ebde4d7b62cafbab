"""A rank leaving the job while its peers wait for it: say who, and end the job at once.

When a rank exits (sys.exit, or simply the end of its script) while another rank has already
sent it a message for a call it never made, MPI_Finalize cannot succeed: MPICH refuses to free
COMM_WORLD with "N unmatched message(s)" and the process leaves without telling mpiexec it
finished, which mpiexec takes for a crash and may answer by killing every rank at once, before
the one that waits has timed out and said whom it waited for. The job then ends with nothing but
an exit status, and when the leaving rank's status was 0 that status is 0: MPICH's hydra, seen
here, SIGKILLs the waiting ranks and reports "exit codes 0,0,0", a job that never finished
reading as a success.

So at exit, once no async collective is in flight, each rank probes COMM_WORLD for messages
from every peer. If some arrived unreceived for a call this rank never made (their tag carries
the call's number), the rank prints which peers sent them and for which call, and aborts the job:
the waiting ranks are doomed anyway, and learn nothing by waiting out their timeout. Otherwise
the ranks compare what each of their groups saw (comm/guards/ending.py, unless finalize() did): a
mismatch no wait raised is printed by every rank of its group, which ends with status 1; a peer
that waits for this rank meanwhile asks it what it is doing (comm/guards/stall.py), hears that it is
leaving, and both raise. Then the watchdog stops, minipar's shared windows are freed
(comm/transport/shm.py: MPI_Win_free is collective, and one left open fails MPI_Finalize on
MPICH's OFI netmod), and the answers to questions that came late are taken. Leftovers of calls this
rank already saw fail (a mismatch the program was told of) are nobody's wait: MPI_Finalize is
then left to mpi4py, which ignores its failure, as before. With nothing found, the rank calls
MPI_Finalize itself, right after the probe (mpi4py would do it at the very end of the
interpreter's teardown, tens of milliseconds later, a wider window for a message to slip in).
One that still slips in (MPI_Finalize progresses the network first) fails the finalize: the
rank then says so and exits at once, and mpiexec ends the job.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import time

from minipar.comm.guards import ending, watchdog
from minipar.comm.transport import shm
from minipar.comm.transport.base import CONTROL_TAG, NOTICE_TAG, SEQ_BITS
from minipar.state import process

REPORT_GRACE = 0.3  # seconds between a rank's report at exit and its exit (the others print too)


def arm(world) -> None:
    """Watch this process's exit (minipar.init, MPI transport, two ranks or more): the world
    is kept as `process.exit_check` (minipar.state). Registered after the watchdog's own exit
    hook, so this runs first and stops the watchdog itself."""
    if world.size < 2:
        return
    if process.exit_check is None:
        atexit.register(_at_exit)
    process.exit_check = world  # after finalize() and init() again: the new world's numbers


def calls_ahead(world, tag: int) -> int | None:
    """How many calls past this rank's next one a collective tag's call is (its number is kept
    modulo 2^SEQ_BITS: the nearest one at or after ours); None for other tags."""
    decoded = world._tags.decode(tag)
    return None if decoded is None else (decoded[0] - world._seq) % (1 << SEQ_BITS)


def ahead(world, tag: int) -> bool:
    """Whether a message is for a call this rank has not made yet: a peer's debug-mode check,
    or a collective tag whose call is at or after this rank's next one (within half the range)."""
    if tag == CONTROL_TAG:
        return True
    distance = calls_ahead(world, tag)
    return distance is not None and distance < 1 << (SEQ_BITS - 1)


def describe(world, tag: int) -> str:
    """What a message's tag says it was for, in the words of minipar's errors."""
    if tag == CONTROL_TAG:
        return "its debug-mode check before a collective"
    distance = calls_ahead(world, tag)
    if distance is None:
        return f"a point-to-point message, tag {tag}"
    return f"call #{world._seq + distance} on group {world.name} (tag {tag})"


def message(world, found: list[tuple[int, int]]) -> str:
    me = world.global_ranks[world.rank]
    lines = [f"[rank {me}] minipar: this rank is leaving the job, but messages sent to it were "
             "never received:"]  # fmt: skip
    for peer, tag in found:
        lines.append(f"[rank {me}]   from rank {world.global_ranks[peer]}: "
                     f"{describe(world, tag)}")  # fmt: skip
    peers = ", ".join(str(world.global_ranks[peer]) for peer, _ in found)
    lines.append(f"[rank {me}] minipar: rank(s) {peers} wait for this rank in a call it never "
                 "made; aborting the job rather than let them wait out their timeout")  # fmt: skip
    return "\n".join(lines) + "\n"


def _at_exit() -> None:
    from mpi4py import MPI  # loaded already: this runs only after an MPI world was armed

    world = process.exit_check
    busy = process.progress is not None and not process.progress.idle()
    if not MPI.Is_initialized() or MPI.Is_finalized() or busy:
        watchdog.shutdown()
        return  # an async collective still runs: leave MPI alone (mpi4py finalizes or not)
    found = watchdog.oldest(world, MPI.Status())
    waiting = [(peer, tag) for peer, tag in found if ahead(world, tag)]
    if waiting:
        watchdog.shutdown()
        sys.stderr.write(message(world, waiting))
        world.abort(1)
        os._exit(1)  # MPICH's MPI_Abort may return when called this late in the exit
    texts = [] if getattr(world, "_ended", False) else ending.check(world, "exit")
    watchdog.shutdown()  # its probes must not run beside ours, nor after MPI_Finalize
    if texts:
        ending.report(world, texts, "exit")
        time.sleep(REPORT_GRACE)  # the other ranks of the group print theirs meanwhile
        os._exit(1)
    if texts is None or world._control_spent:  # a control all-gather is still pending (a rank
        return  # never came to the comparison): leave MPI alone, mpi4py finalizes or not
    shm.free_all()  # the ranks left the comparison together: the windows' collective frees
    take_control_messages()
    found = watchdog.oldest(world, MPI.Status())
    if found:  # leftovers of calls this rank already saw fail (a mismatch): nobody waits
        return  # for them; leave MPI_Finalize to mpi4py, which ignores its failure
    import mpi4py

    if mpi4py.rc.finalize is False:
        return
    try:
        MPI.Finalize()
    except MPI.Exception as error:  # a message came in after the probe: COMM_WORLD is gone
        me = world.global_ranks[world.rank]
        sys.stderr.write(f"[rank {me}] minipar: this rank is leaving the job, but a peer sent it "
                         f"a message it never received ({why(error)}); the peer waits for this "
                         "rank in a call it never made: ending the job\n")  # fmt: skip
        sys.stderr.flush()
        os._exit(1)  # MPI_Abort needs the communicator MPI_Finalize just freed; mpiexec ends it


def take_control_messages() -> None:
    """Receive the notices and late answers still waiting on this rank's groups (a question a
    peer asked just before its wait ended): an unreceived one would fail MPI_Finalize."""
    from mpi4py import MPI  # loaded already

    for comm in ending.live_groups():
        if not hasattr(comm, "_late"):
            continue
        while comm.mpi.Iprobe(MPI.ANY_SOURCE, NOTICE_TAG):
            comm.mpi.recv(source=MPI.ANY_SOURCE, tag=NOTICE_TAG)
        deadline = time.monotonic() + 0.2  # an answer is due within a watchdog period
        while comm._late and time.monotonic() < deadline:
            watchdog.take_late(comm)
            time.sleep(1e-3)


def why(error) -> str:
    """The last line of an MPI error stack, without its `function(line)...:` prefix."""
    last = str(error).strip().splitlines()[-1]
    return re.sub(r"^\S+\(\d+\)\.*:\s*", "", last)
