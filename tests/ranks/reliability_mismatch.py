"""Without debug mode, a count mismatch never passes silently (MPI transport; see minipar.testing).

For every collective and algorithm, the last rank passes a larger count than the others. The MPI
transport checks the size of every message it receives, so some rank must raise
MessageSizeError (a message of the wrong size arrived) or CommTimeoutError (a peer stopped
after its own error): never may every rank return as if all were well.

Each (collective, algorithm) runs on a fresh group with a short timeout, all of them at once on
threads (the groups are independent communicators), so the case costs one timeout, not forty.
Under torch's gloo a size mismatch aborts the process instead; tests/faults covers that.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

import minipar
from minipar.errors import CommTimeoutError, MessageSizeError

TIMEOUT = 1.0


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
    except (MessageSizeError, CommTimeoutError) as error:
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
    silent = [
        f"{c} ({a})"
        for i, (c, a) in enumerate(combos())
        if all(outcomes[i] == "returned" for outcomes in everyone)
    ]
    assert not silent, f"count mismatch passed silently in: {silent}"


def cases(size):
    return {"mismatch.count_is_loud": count_mismatch_is_loud}
