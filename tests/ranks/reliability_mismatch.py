"""Without debug mode, ranks that disagree about a call never pass silently (MPI transport; see
minipar.testing and docs/errors.md, "Mismatches without debug mode").

Every collective tag carries a hash of the call's signature, so disagreeing ranks' messages never
match, and the watchdog (minipar/comm/guards/watchdog.py) names both calls. The cases:

- `mismatch.<mistake>`: the four mistakes of issue 16's table (root, op, same bytes in another
  dtype, different counts), a few more (another collective, another algorithm, a skipped call),
  and issue 27's, where no message shows the mismatch (every rank its own broadcast root or
  scatter root, reduce's dst, the same all_reduce on two groups), each on a fresh group: EVERY
  rank must raise MismatchError within LIMITS seconds of the last rank making the bad call
  (1 s for issue 16's, found from a foreign tag; 2 s for issue 27's, found by a stalled wait
  asking its peers or at the next call), with a message naming both calls and what differs.
  Each rank then goes on as a program would (a barrier on the group every 10 ms): a rank that
  only sent learns of the mismatch at its next call, which cannot match (the tags carry the
  history). Rank 0 writes each case's times to stderr (`mismatch-timing <case> <rank> <s>`).
- `mismatch.count_is_loud`: every collective with every algorithm, the last rank passing a
  larger count: every rank raises MismatchError.
- `mismatch.next_call_raises`: after a scatter every rank left with its own piece, the next call
  (at once, before any watchdog look) raises instead of computing.
- `mismatch.matching_calls_pass`, `mismatch.slow_peer_passes`, `mismatch.async_order_passes`:
  ranks that agree, with numpy on some ranks and torch on others, async calls in flight, a rank
  far ahead, a rank 1.2 s late (4 x the suite's mismatch_after, ASK_AFTER: its peers ask it,
  twice and more), calls on two groups in different orders where one is async (legal: the
  async one waits on its own thread), raise nothing.
- `mismatch.p2p_timeout_says`: a recv that times out says what its peer is doing (stuck in a
  broadcast on another group); the peer's own wait, asking, does not mistake the recv for a
  mismatch.
- `mismatch.threads`: minipar runs no thread but the watchdog (PERIOD 0.1 s) and the progress one.
"""

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

import minipar
from minipar.errors import CommTimeoutError, MessageSizeError, MismatchError

TIMEOUT = 5.0  # a group's timeout: a mismatch the watchdog missed shows as a CommTimeoutError
LIMIT = 1.0  # seconds from the last rank's bad call to every rank's MismatchError (foreign tag)
ASKED_LIMIT = 2.0  # the same, for mistakes no message shows (a stalled wait asks, ASK_AFTER)
# the suite's mismatch_after: a wait asks its peers after 0.3 s instead of minipar's default 1 s,
# the same mechanism sooner, so that the cases that wait for a question (or past one) wait less
ASK_AFTER = 0.3
LATE = 4 * ASK_AFTER  # how late the slow peer is: its peers ask it, and ask it again


def world():
    """The default group, with the suite's mismatch_after (the harness resets it after a case)."""
    return minipar.init(mismatch_after=ASK_AFTER)


def call(collective, algorithm, group, block):
    """One call with `block` elements per rank's block (the last rank passes a bigger one)."""
    p, r = group.size, group.rank
    x = np.ones(block * p)
    kw = dict(group=group, algorithm=algorithm)
    if collective == "broadcast":
        minipar.broadcast(x, 0, **kw)
    elif collective == "all_reduce":
        minipar.all_reduce(x, **kw)
    elif collective == "reduce":
        minipar.reduce(x, 0, **kw)
    elif collective == "all_gather":
        minipar.all_gather_into_tensor(np.zeros(block * p), np.ones(block), **kw)
    elif collective == "reduce_scatter":
        minipar.reduce_scatter_tensor(np.zeros(block), x, **kw)
    elif collective == "scatter":
        parts = [np.ones(block) for _ in range(p)] if r == 0 else None
        minipar.scatter(np.zeros(block), parts, 0, **kw)
    elif collective == "gather":
        parts = [np.zeros(block) for _ in range(p)] if r == 0 else None
        minipar.gather(np.ones(block), parts, 0, **kw)
    elif collective == "all_to_all":
        minipar.all_to_all_single(np.zeros(block * p), x, **kw)


def outcome(collective, algorithm, group, block):
    try:
        call(collective, algorithm, group, block)
        minipar.barrier(group=group)  # the next call: where a rank that only sent finds out
    except (MismatchError, MessageSizeError, CommTimeoutError) as error:
        return type(error).__name__
    return "returned"


COLLECTIVES = [
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "scatter",
    "gather",
    "all_to_all",
]


def combos():
    return [(c, a) for c in COLLECTIVES for a in minipar.algorithms(c)]


def count_mismatch_is_loud():
    w = world()
    if w.size < 2:
        return
    groups = []
    for _ in combos():  # group creation is collective: the same order on every rank
        g = minipar.new_group(list(range(w.size)))
        g.timeout = TIMEOUT
        groups.append(g)
    block = 3 if w.rank == w.size - 1 else 2
    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        futures = [pool.submit(outcome, c, a, g, block) for (c, a), g in zip(combos(), groups)]
        mine = [f.result() for f in futures]
    everyone = w.allgather_object(mine)
    wrong = [
        f"{c} ({a}): {[outcomes[i] for outcomes in everyone]}"
        for i, (c, a) in enumerate(combos())
        if any(outcomes[i] != "MismatchError" for outcomes in everyone)
    ]
    assert not wrong, f"count mismatch not raised as MismatchError on every rank: {wrong}"


# -- the mistakes: (what each rank calls, fragments every rank's message must contain) --------
def _root(g):
    minipar.broadcast(np.ones(8, np.float32), g.rank % 2, group=g)


def _op(g):
    op = minipar.ReduceOp.MAX if g.rank == 0 else minipar.ReduceOp.SUM
    minipar.all_reduce(np.ones(8, np.float32), op=op, group=g)


def _dtype(g):  # 32 bytes either way: the messages line up, the meaning does not
    minipar.all_reduce(np.ones(8, np.float32) if g.rank == 0 else np.ones(4), group=g)


def _count(g):  # rank 0 used to wait the full timeout here
    minipar.all_reduce(np.ones(10 + 2 * g.rank), group=g)


def _collective(g):
    x = np.ones(8)
    if g.rank == g.size - 1:
        minipar.broadcast(x, 0, group=g)
    else:
        minipar.all_reduce(x, group=g)


def _algorithm(g):
    minipar.all_reduce(np.ones(8), group=g, algorithm="ring" if g.rank == 0 else "linear")


def _skipped(g):
    x = np.ones(8)
    if g.rank != g.size - 1:
        minipar.broadcast(x, 0, group=g)  # the last rank forgot this one
    minipar.all_reduce(x, group=g)


# issue 27: no message shows these; the ranks find out by asking, or at the next call
def _own_root(g):  # every rank believes it is the root: every rank only sends, and returns
    minipar.broadcast(np.ones(8, np.float32), g.rank, group=g)


def _dst(g):  # every rank waits to receive as the root, nobody sends
    minipar.reduce(np.ones(8, np.float32), g.rank, group=g)


def _scatter_src(g):  # every rank returns its own piece
    parts = [np.full(2, float(g.rank)) for _ in range(g.size)]
    minipar.scatter(np.zeros(2), parts, g.rank, group=g)


def _group(g):  # the last rank calls it on another group of the same ranks
    twin = g.twin  # made by the case beside g, on every rank
    minipar.all_reduce(np.ones(8), group=twin if g.rank == g.size - 1 else g)


MISTAKES = {
    "root": (_root, ["broadcast(src=0, float32 x 8)", "broadcast(src=1, float32 x 8)", "in src"]),
    "op": (_op, ["all_reduce(op=MAX, float32 x 8)", "all_reduce(op=SUM, float32 x 8)", "in op"]),
    "dtype": (_dtype, ["(op=SUM, float32 x 8)", "(op=SUM, float64 x 4)", "in dtype, count"]),
    "count": (_count, ["float64 x 1", "in count", "call #0 on group mistake_count"]),
    "collective": (_collective, ["called all_reduce(", "called broadcast(", "in collective"]),
    "algorithm": (_algorithm, ["algorithm=ring", "algorithm=linear", "in algorithm"]),
    "skipped": (_skipped, ["called broadcast(src=0", "called all_reduce(op=SUM"]),
    "own_root": (_own_root, ["called broadcast(src=", "float32 x 8) on group", "in src"]),
    "dst": (_dst, ["called reduce(dst=", "op=SUM, float32 x 8) on group mistake_dst", "in dst"]),
    "scatter_src": (_scatter_src, ["called scatter(src=", "float64 x 2) on group", "in src"]),
    "group": (
        _group,
        [
            "all_reduce(op=SUM, float64 x 8) on group mistake_group but rank",
            "on group mistake_group_twin (call #0 on group",
            "they differ in group",
        ],
    ),
}
LIMITS = {name: ASKED_LIMIT for name in ("own_root", "dst", "scatter_src", "group")}


def mistake_is_loud(name):
    make, fragments = MISTAKES[name]

    def case():
        w = world()
        if w.size < 2:
            return
        limit = LIMITS.get(name, LIMIT)
        g = minipar.new_group(list(range(w.size)), name=f"mistake_{name}")
        g.twin = minipar.new_group(list(range(w.size)), name=f"mistake_{name}_twin")
        g.timeout = g.twin.timeout = TIMEOUT
        w.barrier()
        start = time.time()
        try:
            make(g)
            while time.time() < start + 3 * limit:  # the program goes on: compute, then calls
                minipar.barrier(group=g)
                time.sleep(0.01)
        except MismatchError as error:
            got = ("MismatchError", str(error))
        except Exception as error:  # noqa: BLE001  (reported below, with the other ranks')
            got = (type(error).__name__, str(error))
        else:
            got = ("returned", "")
        end = time.time()
        everyone = w.allgather_object((start, end, got))
        last_start = max(s for s, _, _ in everyone)
        if w.rank == 0:
            for rank, (_, end, _) in enumerate(everyone):
                print(f"mismatch-timing {name} {rank} {end - last_start:.3f}", file=sys.stderr)
        for rank, (_, end, (kind, message)) in enumerate(everyone):
            assert kind == "MismatchError", f"rank {rank}: {kind} {message}"
            missing = [f for f in fragments if f not in message]
            assert not missing, f"rank {rank}: {missing} not in: {message}"
            took = end - last_start
            assert took < limit, f"rank {rank} raised {took:.2f} s after the bad call: {message}"

    return case


def matching_calls_pass():
    """Agreeing ranks raise nothing: numpy here and torch there, async calls in flight (the
    watchdog sees their messages arrive before their receives are posted), rank 0 far ahead."""
    w = world()
    g = minipar.new_group(list(range(w.size)), name="agreeing")
    g.timeout = TIMEOUT
    p, r = g.size, g.rank
    for _ in range(3):
        x = np.full(6, float(r)) if r % 2 else torch.full((6,), float(r), dtype=torch.float64)
        minipar.all_reduce(x, group=g)
        assert float(x[0]) == sum(range(p))
    works = [
        minipar.broadcast(np.full(4, i, np.int32), 0, group=g, async_op=True) for i in range(40)
    ]
    if r:
        time.sleep(0.3)  # rank 0's broadcasts wait, unreceived, while the watchdog looks
    for work in works:
        work.wait()
    for i in range(50):  # rank 0 only sends: it runs ahead of the others by up to 50 calls
        x = np.full(3, i if r == 0 else -1, np.int64)
        minipar.broadcast(x, 0, group=g, algorithm="linear")
        assert (x == i).all(), x
    minipar.barrier(group=g)
    time.sleep(0.3)  # give the watchdog a few looks at whatever is left
    assert g._failure is None, g._failure


def next_call_raises():
    """Every rank returned from a scatter whose roots disagree (each kept its own piece); the
    very next call on the group, made at once, must raise (its tags carry the history, so it
    cannot match), not compute: the watchdog names the scatter meanwhile."""
    w = world()
    if w.size < 2:
        return
    g = minipar.new_group(list(range(w.size)), name="next_call")
    g.timeout = TIMEOUT
    _scatter_src(g)
    x = np.ones(4)
    try:
        minipar.all_reduce(x, group=g)
    except MismatchError as error:
        message = str(error)
    else:
        raise AssertionError(f"the call after the bad scatter returned {x}")
    assert "called scatter(src=" in message and "(call #0 on group next_call;" in message, message


def slow_peer_passes():
    """A rank LATE s late: the others' waits ask it (it computes), again and again: no error."""
    w = world()
    if w.size < 2:
        return  # no one to be late for
    g = minipar.new_group(list(range(w.size)), name="slow_peer")
    g.timeout = TIMEOUT
    x = np.full(4, float(g.rank))
    if g.rank == g.size - 1:
        time.sleep(LATE)
    minipar.all_reduce(x, group=g)
    assert (x == sum(range(g.size))).all(), x
    y = np.full(3, 7.0 if g.rank == 0 else 0.0)
    if g.rank == 0:
        time.sleep(2 * ASK_AFTER)  # the others wait in a broadcast from a root that is late
    minipar.broadcast(y, 0, group=g)
    assert (y == 7.0).all(), y
    minipar.barrier(group=g)
    assert g._failure is None, g._failure


def async_order_passes():
    """Two groups called in different orders, legal because rank 0's first call is async: its
    progress thread waits on g while its main thread calls h (the others, h first, then a pause of
    2 x ASK_AFTER: rank 0's async call stalls and asks; nobody is stuck in every thread)."""
    w = world()
    if w.size < 2:
        return
    g = minipar.new_group(list(range(w.size)), name="order_g")
    h = minipar.new_group(list(range(w.size)), name="order_h")
    g.timeout = h.timeout = TIMEOUT
    x, y = np.ones(4), np.ones(4)
    if w.rank == 0:
        work = minipar.all_reduce(x, group=g, async_op=True)
        minipar.all_reduce(y, group=h)
        work.wait()
    else:
        minipar.all_reduce(y, group=h)
        time.sleep(2 * ASK_AFTER)
        minipar.all_reduce(x, group=g)
    assert (x == w.size).all() and (y == w.size).all(), (x, y)
    minipar.barrier(group=g)
    minipar.barrier(group=h)
    assert g._failure is None and h._failure is None, (g._failure, h._failure)


def p2p_timeout_says():
    """Rank 0's recv from rank 1 times out while rank 1 waits in a broadcast on another group
    whose root is rank 0: the timeout says so. Rank 1's broadcast asks rank 0 meanwhile and
    finds it in a recv (point-to-point: no verdict); it completes once rank 0 joins."""
    w = world()
    if w.size < 2:
        return
    g = minipar.new_group(list(range(w.size)), name="p2p_recv")
    other = minipar.new_group(list(range(w.size)), name="p2p_other")
    g.timeout, other.timeout = 3 * ASK_AFTER, TIMEOUT  # rank 1 asks before rank 0 times out
    y = np.full(4, 5.0 if w.rank == 0 else 0.0)
    message = ""
    if w.rank == 0:
        try:
            g.recv(np.empty(4), 1, tag=3)  # rank 1 never sends it
        except CommTimeoutError as error:
            message = str(error)
    minipar.broadcast(y, 0, group=other)
    assert (y == 5.0).all(), y
    assert other._failure is None, other._failure
    if w.rank == 0:
        want = "; rank 1 is waiting in broadcast(src=0, float64 x 4) (call #0 on group p2p_other)"
        assert want in message, message
        waited = f"timed out after {3 * ASK_AFTER:g} s waiting for recv of 32 bytes from rank 1"
        assert f"{waited} (tag 3)" in message, message


def threads():
    """minipar's own threads: the watchdog (one look every PERIOD = 0.1 s) and the progress
    thread; the stalled-wait questions run on the waiting thread and the watchdog's."""
    from minipar.comm.guards import watchdog

    w = world()
    minipar.all_reduce(np.ones(2))
    minipar.all_reduce(np.ones(2), async_op=True).wait()
    names = sorted(t.name for t in threading.enumerate())
    allowed = {"MainThread", "minipar-watchdog", "minipar-progress"}
    assert set(names) <= allowed, names
    assert watchdog.PERIOD == 0.1
    if w.size > 1:
        assert "minipar-watchdog" in names, names


# the cases that mostly wait (a late peer, two orders, a recv timing out: 7 s a launch): run
# by test_reliability.py on 2 and 4 ranks only, not again in the 3-rank all-in-one suite
WAITING = ("mismatch.slow_peer_passes", "mismatch.async_order_passes", "mismatch.p2p_timeout_says")


def cases(size):
    table = {"mismatch.count_is_loud": count_mismatch_is_loud}
    table.update({f"mismatch.{name}": mistake_is_loud(name) for name in MISTAKES})
    table["mismatch.matching_calls_pass"] = matching_calls_pass
    table["mismatch.next_call_raises"] = next_call_raises
    table["mismatch.slow_peer_passes"] = slow_peer_passes
    table["mismatch.async_order_passes"] = async_order_passes
    table["mismatch.p2p_timeout_says"] = p2p_timeout_says
    table["mismatch.threads"] = threads
    return table
