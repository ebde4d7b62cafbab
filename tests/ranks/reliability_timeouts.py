"""Timeouts name what was awaited, run on every rank (see minipar.testing).

In each case the last rank stays away from a call on a fresh group with a short timeout, and the
ranks that wait must raise CommTimeoutError naming the collective and algorithm, the group, their
rank, the step, and the peer they waited for (at least one waiting rank names the absent one).
The fresh group is dropped afterwards, so messages left over from the abandoned call can never
meet a later one.
"""

import time

import numpy as np

import minipar
from minipar.errors import CommTimeoutError

TIMEOUT = 0.25  # short: every case waits it out on purpose


def world():
    return minipar.init()


def abandoned(name):
    """A fresh group of every rank with a short timeout; the last rank will stay away."""
    w = world()
    g = minipar.new_group(list(range(w.size)), name=name)
    g.timeout = TIMEOUT
    return w, g, g.rank == g.size - 1


def gather_messages(w, call):
    """Run call() on every rank but the last; return every rank's timeout message (None there)."""
    message = None
    if w.rank != w.size - 1:
        try:
            call()
        except CommTimeoutError as error:
            message = str(error)
        else:
            message = "no CommTimeoutError"
    messages = w.allgather_object(message)  # every rank gets here, whatever happened
    assert "no CommTimeoutError" not in messages, messages
    return messages


def collective_timeout(collective, algorithm):
    def case():
        w, g, _ = abandoned(f"late_{collective}")
        if w.size < 2:
            return
        p = w.size
        x, out = np.ones(2 * p), np.zeros(2 * p * p)
        calls = {
            "all_reduce": lambda: minipar.all_reduce(x, group=g, algorithm=algorithm),
            "broadcast": lambda: minipar.broadcast(x, p - 1, group=g, algorithm=algorithm),
            "all_gather": lambda: minipar.all_gather_into_tensor(out, x, g, algorithm),
            "barrier": lambda: minipar.barrier(group=g, algorithm=algorithm),
        }
        messages = gather_messages(w, calls[collective])
        for rank, message in enumerate(messages[:-1]):
            for part in (
                f"{collective} (algorithm {algorithm}) on group late_{collective}",
                f"rank {rank}, step ",
                f"timed out after {TIMEOUT:g} s waiting for ",
            ):
                assert part in message, (part, message)
        assert any(f" rank {p - 1} (tag" in m for m in messages[:-1]), messages

    return case


def async_timeout():
    """An async call's Work.wait() re-raises the progress thread's timeout, with its message."""
    w, g, away = abandoned("late_async")
    if w.size < 2:
        return
    message = None
    if not away:
        work = minipar.all_reduce(np.ones(4), group=g, algorithm="ring", async_op=True)
        try:
            work.wait()
        except CommTimeoutError as error:
            message = str(error)
        if not (work.is_completed() and isinstance(work.exception(), CommTimeoutError)):
            message = "the Work does not hold the error"
    messages = w.allgather_object(message)
    for m in messages[:-1]:
        assert "all_reduce (algorithm ring) on group late_async" in m, m
    assert any(f"from rank {w.size - 1} (tag" in m for m in messages[:-1]), messages


def p2p_timeout():
    w, g, away = abandoned("late_p2p")
    if w.size < 2:
        return
    last = w.size - 1
    messages = gather_messages(w, lambda: g.recv(np.zeros(4), last, tag=5))
    for rank, message in enumerate(messages[:-1]):
        want = f"recv of 32 bytes from rank {last} (tag 5) on group late_p2p, as rank {rank}"
        assert want in message, message


def barrier_timeout():
    """The transport's own barrier (MPI_Ibarrier or torch's) is bounded too."""
    w, g, away = abandoned("late_barrier")
    if w.size < 2:
        return
    messages = gather_messages(w, g.barrier)
    for message in messages[:-1]:
        assert "barrier on group late_barrier: timed out after" in message, message
        assert "the other ranks of group late_barrier to reach the barrier" in message
    if g.backend == "mpi" and not away:
        # the abandoned MPI_Ibarrier would complete with the next one: refused, and said why
        for again in (g.barrier, lambda: g.allgather_object(w.rank)):
            try:
                again()
            except minipar.errors.MiniparError as error:
                assert "cannot run another control collective" in str(error), error
                assert "reach the barrier timed out on group late_barrier" in str(error), error
            else:
                raise AssertionError("a control call ran on a group whose barrier timed out")


def barrier_asleep_timeout():
    """The barrier waited for asleep (lessons' ranks that are not timed) is bounded as well."""
    w, g, away = abandoned("late_asleep")
    if w.size < 2:
        return
    started = time.monotonic()
    messages = gather_messages(w, lambda: g.barrier_asleep(0.01))
    for message in messages[:-1]:
        assert "barrier on group late_asleep: timed out after" in message, message
    if not away:
        assert time.monotonic() - started >= TIMEOUT, "it gave up before its timeout"


def barrier_asleep_waits():
    """Every rank leaves the barrier waited for asleep only after the last has come (it comes
    0.2 s late here)."""
    w = world()
    g = minipar.new_group(list(range(w.size)), name="asleep")
    g.barrier()
    started = time.monotonic()
    if g.rank == g.size - 1:
        time.sleep(0.2)
    g.barrier_asleep(0.005)
    assert time.monotonic() - started >= 0.2 or w.size == 1, "left before the last rank came"


def debug_check_timeout():
    """Debug mode's fingerprint exchange names the rank that never came."""
    w, g, away = abandoned("late_debug")
    if w.size < 2:
        return
    minipar.init(debug=True)
    try:
        messages = gather_messages(w, lambda: minipar.all_reduce(np.ones(3), group=g))
    finally:
        minipar.init(debug=False)
    for rank, message in enumerate(messages[:-1]):
        assert f"debug check before all_reduce (call #0) on group late_debug, rank {rank}" in (
            message
        ), message
        assert f"rank {w.size - 1} (tag" in message, message


def cases(size):
    table = {}
    for collective, algorithm in [
        ("all_reduce", "ring"),
        ("all_reduce", "recursive_doubling"),
        ("broadcast", "tree"),
        ("all_gather", "bruck"),
        ("barrier", "dissemination"),
    ]:
        table[f"timeout.{collective}.{algorithm}"] = collective_timeout(collective, algorithm)
    table["timeout.async"] = async_timeout
    table["timeout.p2p_recv"] = p2p_timeout
    table["timeout.transport_barrier"] = barrier_timeout
    table["timeout.barrier_asleep"] = barrier_asleep_timeout
    table["barrier_asleep.waits"] = barrier_asleep_waits
    table["timeout.debug_check"] = debug_check_timeout
    return table
