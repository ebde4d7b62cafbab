"""Concurrency: collectives on overlapping groups interleaved, async calls in flight while the main
thread issues more (blocking collectives and user point-to-point), run on every rank (see
minipar.testing). Every value is unique to its (round, group, rank), integer-valued so sums are
exact, so a message that reached the wrong call would show as a wrong number.

Groups: the world, the even and the odd ranks, the lower and the upper half. Every rank visits
its groups in the same global order, which is what keeps blocking calls on overlapping groups
free of deadlock (as in MPI); async calls run on the progress thread in the order issued.
"""

import numpy as np

import minipar

COLLECTIVES = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "reduce"]


def groups():
    """[(name, group or None if this rank is not a member, member world ranks)], same order
    everywhere (new_group is collective)."""
    w = minipar.init()
    p = w.size
    half = (p + 1) // 2
    table = [("world", list(range(p)))]
    if p > 1:
        table += [
            ("evens", list(range(0, p, 2))),
            ("odds", list(range(1, p, 2))),
            ("lower", list(range(half))),
            ("upper", list(range(half, p))),
        ]
    out = []
    for name, ranks in table:
        g = w if name == "world" else minipar.new_group(ranks, name=name)
        out.append((name, g if w.rank in ranks else None, ranks))
    return out


def value(k, gi, rank, n):
    """The input of group rank `rank` in call k on group gi: unique, integer-valued."""
    return np.arange(n, dtype=np.float64) + 1000.0 * k + 100.0 * gi + rank


def start(collective, algorithm, g, k, gi, async_op):
    """Issue one call; returns (Work or None, check) where check() asserts the exact result."""
    p, r, n = g.size, g.rank, 2 * g.size
    kw = dict(group=g, algorithm=algorithm, async_op=async_op)
    every = [value(k, gi, q, n) for q in range(p)]
    x = value(k, gi, r, n)
    if collective == "all_reduce":
        work, want, got = minipar.all_reduce(x, **kw), sum(every), x
    elif collective == "reduce":
        work, got = minipar.reduce(x, p - 1, **kw), x
        want = sum(every) if r == p - 1 else value(k, gi, r, n)
    elif collective == "broadcast":
        work, want, got = minipar.broadcast(x, p // 2, **kw), every[p // 2], x
    elif collective == "all_gather":
        got = np.zeros(n * p)
        work, want = minipar.all_gather_into_tensor(got, x, **kw), np.concatenate(every)
    elif collective == "reduce_scatter":
        got = np.zeros(2)
        work, want = minipar.reduce_scatter_tensor(got, x, **kw), sum(every)[2 * r : 2 * r + 2]
    else:
        got = np.zeros(n)
        work = minipar.all_to_all_single(got, x, **kw)
        want = np.concatenate([e[2 * r : 2 * r + 2] for e in every])

    def check():
        assert np.array_equal(got, want), (collective, algorithm, g.name, k, got, want)

    return work, check


def algorithm_for(collective, k):
    names = minipar.algorithms(collective)
    return names[k % len(names)]


def interleaved_groups():
    """Blocking collectives, round after round, on all of a rank's (overlapping) groups."""
    table = groups()
    for k in range(12):
        for gi, (_, g, _) in enumerate(table):
            if g is not None:
                collective = COLLECTIVES[(k + gi) % len(COLLECTIVES)]
                _, check = start(collective, algorithm_for(collective, k), g, k, gi, False)
                check()


def user_ring_shift(w, k):
    """A user point-to-point message around the world ring (user tag k), checked."""
    got = np.zeros(3)
    w.sendrecv(np.full(3, 10.0 * k + w.rank), (w.rank + 1) % w.size, got, (w.rank - 1) % w.size, k)
    assert (got == 10.0 * k + (w.rank - 1) % w.size).all(), (k, got)


def async_in_flight(debug=False):
    """Async calls on every group pile up while the main thread runs blocking calls and user
    messages; the Works are waited last, newest first."""

    def case():
        minipar.init(debug=debug)
        try:
            run_async_in_flight()
        finally:
            minipar.init(debug=False)

    return case


def run_async_in_flight():
    w = minipar.init()
    table = groups()
    pending = []
    for k in range(10):
        for gi, (_, g, _) in enumerate(table):
            if g is None:
                continue
            collective = COLLECTIVES[(k + 2 * gi) % len(COLLECTIVES)]
            pending.append(start(collective, algorithm_for(collective, k + 1), g, k, gi, True))
        x = np.full(5, float(w.rank + k))  # a blocking call on the world meanwhile
        minipar.all_reduce(x, algorithm=algorithm_for("all_reduce", k))
        assert (x == sum(range(w.size)) + k * w.size).all(), (k, x)
        user_ring_shift(w, k)
        pending[len(pending) // 2][0].is_completed()  # polling is harmless
    for work, check in reversed(pending):
        assert work.wait() is True and work.is_completed()
        check()


def many_on_one_group():
    """Twenty async calls on the world, of every collective and algorithm, plus blocking ones
    on the same group between them: the per-call tags keep them apart."""
    w = minipar.init()
    pending = []
    for k in range(20):
        collective = COLLECTIVES[k % len(COLLECTIVES)]
        pending.append(start(collective, algorithm_for(collective, k // 2), w, k, 0, True))
        _, check = start("all_gather", algorithm_for("all_gather", k), w, k, 9, False)
        check()
    for work, check in pending:
        work.wait()
        check()


def cases(size):
    return {
        "concurrency.interleaved_groups": interleaved_groups,
        "concurrency.async_in_flight": async_in_flight(),
        "concurrency.async_in_flight_debug": async_in_flight(debug=True),
        "concurrency.many_on_one_group": many_on_one_group,
    }
