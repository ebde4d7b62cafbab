"""Without debug mode, ranks that disagree about a call never pass silently (MPI transport; see
minipar.testing and docs/errors.md, "Mismatches without debug mode").

Every collective tag carries a hash of the call's signature, so disagreeing ranks' messages never
match, and the watchdog (minipar/comm/watchdog.py) names both calls. The cases:

- `mismatch.<mistake>`: the four mistakes of issue 16's table (root, op, same bytes in another
  dtype, different counts) and a few more (another collective, another algorithm, a skipped
  call), each on a fresh group: EVERY rank must raise MismatchError within LIMIT seconds of the
  last rank making the bad call, with a message naming both calls and what differs. Each rank
  then goes on as a program would (a barrier on the group every 10 ms): a rank that only sent
  (two ranks that both think they are the root) learns of the mismatch at its next call after
  the watchdog's look.
- `mismatch.count_is_loud`: every collective with every algorithm, the last rank passing a
  larger count: every rank raises MismatchError.
- `mismatch.matching_calls_pass`: ranks that agree, with numpy on some ranks and torch on others,
  async calls in flight and a rank far ahead, raise nothing.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

import minipar
from minipar.errors import CommTimeoutError, MessageSizeError, MismatchError

TIMEOUT = 5.0  # a group's timeout: a mismatch the watchdog missed shows as a CommTimeoutError
LIMIT = 1.0  # seconds from the last rank's bad call to every rank's MismatchError


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
    w = minipar.init()
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


MISTAKES = {
    "root": (_root, ["broadcast(src=0, float32 x 8)", "broadcast(src=1, float32 x 8)", "in src"]),
    "op": (_op, ["all_reduce(op=MAX, float32 x 8)", "all_reduce(op=SUM, float32 x 8)", "in op"]),
    "dtype": (_dtype, ["(op=SUM, float32 x 8)", "(op=SUM, float64 x 4)", "in dtype, count"]),
    "count": (_count, ["float64 x 1", "in count", "call #0 on group mistake_count"]),
    "collective": (_collective, ["called all_reduce(", "called broadcast(", "in collective"]),
    "algorithm": (_algorithm, ["algorithm=ring", "algorithm=linear", "in algorithm"]),
    "skipped": (_skipped, ["called broadcast(src=0", "called all_reduce(op=SUM"]),
}


def mistake_is_loud(name):
    make, fragments = MISTAKES[name]

    def case():
        w = minipar.init()
        if w.size < 2:
            return
        g = minipar.new_group(list(range(w.size)), name=f"mistake_{name}")
        g.timeout = TIMEOUT
        w.barrier()
        start = time.time()
        try:
            make(g)
            while time.time() < start + 3 * LIMIT:  # the program goes on: compute, then calls
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
        for rank, (_, end, (kind, message)) in enumerate(everyone):
            assert kind == "MismatchError", f"rank {rank}: {kind} {message}"
            missing = [f for f in fragments if f not in message]
            assert not missing, f"rank {rank}: {missing} not in: {message}"
            took = end - last_start
            assert took < LIMIT, f"rank {rank} raised {took:.2f} s after the bad call: {message}"

    return case


def matching_calls_pass():
    """Agreeing ranks raise nothing: numpy here and torch there, async calls in flight (the
    watchdog sees their messages arrive before their receives are posted), rank 0 far ahead."""
    w = minipar.init()
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


def cases(size):
    table = {"mismatch.count_is_loud": count_mismatch_is_loud}
    table.update({f"mismatch.{name}": mistake_is_loud(name) for name in MISTAKES})
    table["mismatch.matching_calls_pass"] = matching_calls_pass
    return table
