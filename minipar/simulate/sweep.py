"""An nccl-tests-style sweep on a simulated cluster: each size, each algorithm, one row.

    for row in all_reduce_sweep(1024, preset("h100"), [1 << 20, 1 << 30], ["ring", "tree"]):
        row["time_s"], row["busbw_GBps"], row["predicted_s"], row["wrong"]   # bench's keys too

Each row is one simulated all-reduce of `nbytes` on every rank, run by the algorithm's own file
on scaled data: every rank holds one float32 element per rank (a few kilobytes), each standing
for bytes / (4 p) bytes, so 1,024 ranks x 4 GiB costs what 1,024 x 4 KiB does. The values are
real small integers: every rank's result is checked against the exact sum (`wrong` counts the
ranks that differ). algbw = bytes / time, busbw = algbw x 2 (p-1)/p (nccl-tests' convention: the
rate each link ran at). `predicted_s` is minipar.cost's closed form on the cluster's slowest
link the algorithm crosses (cost.all_reduce_on_cluster for "hierarchical"); reductions cost no
simulated time (a GPU reduces at HBM speed), so the prediction leaves gamma out too.
"""

from __future__ import annotations

import time

import numpy as np

from minipar import cost
from minipar.collectives import api, registry
from minipar.cost.links import Hierarchy, Link
from minipar.simulate.rings import all_reduce_rings, ring_groups
from minipar.simulate.runner import simulate

ELEMENTS_PER_RANK = 1  # of the real buffer: p float32 elements in all
VALUES = 7  # x[i] = (rank + i) mod 7: sums stay exact integers in float32 up to p = 2^21


RINGS = "rings"  # not a registered algorithm: ring.py on one ring per NIC at once (rings.py)


def available(algorithms) -> tuple[list[str], list[str]]:
    """(the all-reduce algorithms registered now, the names asked for that are not); "rings"
    is always there (rings.py: NCCL's channels, made of the unchanged ring)."""
    table = {**registry.ALGORITHMS["all_reduce"], RINGS: None}
    return [a for a in algorithms if a in table], [a for a in algorithms if a not in table]


def all_reduce_sweep(ranks: int, cluster, sizes, algorithms, contention: bool = True):
    """Yield one row (a dict) per (size, algorithm), sizes outermost, as nccl-tests prints."""
    for nbytes in sizes:
        for name in algorithms:
            yield all_reduce_row(ranks, cluster, nbytes, name, contention)


def all_reduce_row(ranks: int, cluster, nbytes: int, algorithm: str, contention: bool = True):
    p = ranks
    channels = cluster.nics if algorithm == RINGS else 1
    n = p * ELEMENTS_PER_RANK * channels
    scale = nbytes / (4 * n)

    def step(rank):
        x = ((np.arange(n) + rank) % VALUES).astype(np.float32)
        if algorithm == RINGS:
            all_reduce_rings(x, ring_groups(p, cluster.per_node, channels))
        else:
            api.all_reduce(x, algorithm=algorithm)
        return x

    cpu = time.process_time()
    run = simulate(step, p, cluster, scale=scale, contention=contention)
    cpu = time.process_time() - cpu
    want = sum((np.arange(n) + r) % VALUES for r in range(p)).astype(np.float32)
    wrong = sum(not np.array_equal(x, want) for x in run.results)
    algbw = nbytes / run.time if run.time > 0 else float("inf")
    return {  # bench's keys (minipar/bench/report.py), then the simulator's own
        "collective": "all_reduce",
        "algorithm": algorithm,
        "implementation": "simulated",
        "world_size": p,
        "nbytes": nbytes,
        "dtype": "float32",
        "time_s_median": run.time,  # one simulated run: deterministic, min = median = max
        "time_s_min": run.time,
        "time_s_max": run.time,
        "algbw_GBps": algbw / 1e9,
        "busbw_GBps": algbw * 2 * (p - 1) / p / 1e9,
        "predicted_s": predicted(algorithm, nbytes, p, cluster),
        "time_s": run.time,
        "per_node": cluster.per_node,
        "nodes": -(-p // cluster.per_node),
        "cluster": cluster.name,
        "messages": run.messages,
        "wall_s": run.wall,
        "cpu_s": cpu,
        "wrong": wrong,
    }


def predicted(algorithm: str, nbytes: float, p: int, cluster) -> float | None:
    """The cost model's seconds for this all-reduce on this cluster (None: no formula)."""
    nodes = -(-p // cluster.per_node)
    if algorithm == "hierarchical":
        if p % cluster.per_node:
            return None
        h = Hierarchy(_no_gamma(cluster.intra), _no_gamma(cluster.inter), cluster.per_node)
        return cost.all_reduce_on_cluster(nbytes, nodes, "hierarchical", h)
    slowest = cluster.inter if nodes > 1 else cluster.intra
    if algorithm == RINGS:  # the NICs' rate added up, unless NVLink is slower
        beta = max(cluster.intra.beta, cluster.inter.beta / cluster.nics) if nodes > 1 else None
        slowest = Link("rings", slowest.alpha, beta or slowest.beta, 0.0)
        algorithm = "ring"
    try:
        return cost.predict("all_reduce", algorithm, nbytes, p, _no_gamma(slowest))
    except ValueError:
        return None


def _no_gamma(link: Link) -> Link:
    return Link(link.name, link.alpha, link.beta, 0.0, link.source)
