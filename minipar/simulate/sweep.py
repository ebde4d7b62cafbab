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

`row(collective, ...)` does the same for all_gather and reduce_scatter (nccl-tests' sizes: the
gather's output, the scatter's input; busbw = algbw (p-1)/p) and takes a protocol: with one,
the links are priced as NCCL's tuner prices them (protocols.py), sends complete when they leave
their port, trees stream their chunks, and `predicted_s` is NCCL's formula; algorithm "nccl"
runs NCCL's pick for the size.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from minipar import cost
from minipar.collectives import api, layout, registry
from minipar.cost.links import Hierarchy, Link
from minipar.simulate import protocols, proxy
from minipar.simulate.nccl_tree import all_reduce_nccl_tree
from minipar.simulate.nvls import all_reduce_nvls, nvls_seconds
from minipar.simulate.rings import all_reduce_rings, ring_groups
from minipar.simulate.runner import concurrently, simulate

ELEMENTS_PER_RANK = 1  # of the real buffer: p float32 elements in all
VALUES = 7  # x[i] = (rank + i) mod 7: sums stay exact integers in float32 up to p = 2^21


RINGS = "rings"  # not a registered algorithm: ring.py on one ring per NIC at once (rings.py)
NCCL_TREE = "nccl_tree"  # nccl_tree.py: a chain in each node, a double binary tree across


def available(algorithms) -> tuple[list[str], list[str]]:
    """(the all-reduce algorithms registered now, the names asked for that are not); "rings"
    (rings.py: NCCL's channels, made of the unchanged ring), "nvls" (nvls.py: the switch's
    sum) and "nccl" (NCCL's pick per size, protocols.py) are always there."""
    table = known()
    return [a for a in algorithms if a in table], [a for a in algorithms if a not in table]


def known() -> list[str]:
    """Every name --algorithms takes: the registered all-reduces, then rings, nvls and nccl."""
    names = [*registry.ALGORITHMS["all_reduce"], RINGS, NCCL_TREE, "nvls", NCCL]
    return list(dict.fromkeys(names))


def all_reduce_sweep(ranks: int, cluster, sizes, algorithms, contention=True, protocol=None):
    """Yield one row (a dict) per (size, algorithm), sizes outermost, as nccl-tests prints."""
    for nbytes in sizes:
        for name in algorithms:
            yield row("all_reduce", ranks, cluster, nbytes, name, protocol, contention)


def all_reduce_row(ranks: int, cluster, nbytes: int, algorithm: str, contention: bool = True):
    return row("all_reduce", ranks, cluster, nbytes, algorithm, None, contention)


def row(collective, ranks, cluster, nbytes, algorithm, protocol=None, contention=True) -> dict:
    """One simulated `collective` of nbytes (nccl-tests' size: the all-gather's output, the
    reduce-scatter's input) by `algorithm` ("nccl": NCCL's pick for the size) under
    `protocol` (None: the cluster's links as given; "nccl": NCCL's pick; LL, LL128, Simple)."""
    p, nodes = ranks, -(-ranks // cluster.per_node)
    ran, proto = resolve(collective, algorithm, protocol, nbytes, p, cluster)
    sim, base = cluster, 0.0
    if proto is not None:
        pricing = protocols.priced(cluster, ran, proto, nodes, nbytes=nbytes)
        sim, base = pricing.cluster, pricing.base
    flow = ran == RINGS and flow_level(cluster, nodes)
    if flow:
        sim = protocols.flow_level_rings(sim, nodes)
    if ran == NCCL_TREE:
        sim = protocols.flow_level_trees(sim, nodes)
    chunks = tree_chunks(nbytes, proto) if proto is not None and ran in TREES else 1
    stream = ran == NCCL_TREE and proto in ("LL", "LL128")
    if stream:  # NVLink hops cut through; the network moves NCCL's chunks, one a loop
        chunks = proxy.tree_posts(nbytes, proto, nodes, cluster.per_node, cluster.nics)[2]
    step, n, want = _step(collective, ran, p, cluster, sim, flow, chunks)
    scale = nbytes / (4 * n)
    cpu = time.process_time()
    post = 0.0
    if ran == NCCL_TREE and proto is not None:  # the head GPU's proxy posts chunk by chunk
        post = proxy.post_seconds(nbytes, proto, nodes, cluster.per_node, cluster.nics, chunks)
    wire = None
    if stream:  # a network hop lands a slot at the NIC's pace (network.py `wire`)
        wire = protocols.flow_level_trees(cluster, nodes).inter.beta / protocols.WIRE_SHARE[proto]
        if chunks == 1:  # one slot a channel: no stream of slots for the kernel's rate to pace
            sim = replace(sim, inter=replace(sim.inter, beta=wire))
    pipelined = proto is not None
    run = simulate(step, p, sim, scale, contention, pipelined, post=post, stream=stream, wire=wire)
    cpu = time.process_time() - cpu
    wrong = sum(not np.array_equal(x, want(r)) for r, x in enumerate(run.results))
    seconds = run.time + base
    algbw = nbytes / seconds if seconds > 0 else float("inf")
    bus = 2 * (p - 1) / p if collective == "all_reduce" else (p - 1) / p
    return {  # bench's keys (minipar/bench/report.py), then the simulator's own
        "collective": collective,
        "algorithm": ran if algorithm != NCCL else f"nccl:{ran}",
        "protocol": proto,
        "implementation": "simulated",
        "world_size": p,
        "nbytes": nbytes,
        "dtype": "float32",
        "time_s_median": seconds,  # one simulated run: deterministic, min = median = max
        "time_s_min": seconds,
        "time_s_max": seconds,
        "algbw_GBps": algbw / 1e9,
        "busbw_GBps": algbw * bus / 1e9,
        "predicted_s": _predicted(collective, ran, proto, nbytes, p, cluster),
        "time_s": seconds,
        "per_node": cluster.per_node,
        "nodes": nodes,
        "cluster": cluster.name,
        "messages": run.messages,
        "wall_s": run.wall,
        "cpu_s": cpu,
        "wrong": wrong,
    }


NCCL = "nccl"  # not an algorithm: NCCL's tuner picks one (and its protocol) per size


def resolve(collective, algorithm, protocol, nbytes, p, cluster):
    """(the algorithm run, the protocol priced or None) for what was asked."""
    nodes = -(-p // cluster.per_node)
    if algorithm == NCCL:
        ran, proto = protocols.choose(collective, nbytes, p, cluster)
        if protocol not in (None, NCCL) and protocol != proto:
            ran, proto = _forced_protocol(collective, nbytes, p, cluster, protocol)
        if ran == "ring" and nodes > 1 and cluster.nics > 1:
            ran = RINGS  # NCCL's ring across nodes is its channels
        if ran == "double_tree" and nodes > 1 and p % cluster.per_node == 0:
            # NCCL's tree across nodes (a chain in the node, a tree across) where latency
            # rules, one slot; beyond it the two-level all-reduce, whose NICs run at once as
            # NCCL's tree channels do (the tree's channels are not modelled flow-level yet)
            ran = NCCL_TREE if nbytes <= MAX_TREE_CHUNKS * TREE_CHUNK else "hierarchical"
        return ran, proto
    if protocol == NCCL:
        family = "ring" if algorithm in ("ring", RINGS) else algorithm
        return algorithm, protocols.choose(collective, nbytes, p, cluster, [family])[1]
    if protocol is not None and protocol not in protocols.PROTOCOLS:
        raise ValueError(
            f"--protocol {protocol!r}: choose nccl, {', '.join(protocols.PROTOCOLS)} or none"
        )
    return algorithm, protocol


def _forced_protocol(collective, nbytes, p, cluster, protocol):
    best = None
    for algorithm in protocols.CANDIDATES[collective]:
        t = protocols.nccl_time(collective, algorithm, protocol, nbytes, p, cluster)
        if t is not None and (best is None or t < best[0]):
            best = (t, algorithm)
    if best is None:
        raise ValueError(f"--protocol {protocol}: no NCCL algorithm runs {collective} with it")
    return best[1], protocol


def flow_level(cluster, nodes: int) -> bool:
    """rings.py's channels priced as one ring: exact when every GPU leaves its node in one
    channel (a NIC a GPU) or there is one channel; otherwise they run one by one at once."""
    return nodes == 1 or cluster.nics in (1, cluster.per_node)


TREES = ("tree", "double_tree", NCCL_TREE)
TREE_CHUNK = 512 << 10  # bytes: NCCL's Simple slot (4 MiB buffer / NCCL_STEPS = 8)
LINE_CHUNK = 4 << 10  # bytes: the smallest LL / LL128 stand-in piece
LINE_PIECES = 16  # LL / LL128 pieces at most: the simulated stream's resolution
MAX_TREE_CHUNKS = 64


def tree_chunks(nbytes: float, protocol: str | None = "Simple") -> int:
    """How many chunks a pipelined tree streams. Simple: one a 512 KiB slot, at most 64 (a
    GPU forwards a slot once it has all of it). LL and LL128 forward each 8- or 128-byte line
    as its flag lands (NCCL's src/device/prims_ll.h, prims_ll128.h), so a hop delays the
    stream by its latency, not by a slot's transfer: 16 pieces of 4 KiB or more stand for
    that stream, never coarser than Simple's slots (finer costs CPU: 64 pieces take 5x, and
    move the validation's mid-size times by under 8%)."""
    slots = int(min(MAX_TREE_CHUNKS, max(1, -(-nbytes // TREE_CHUNK))))
    if protocol in (None, "Simple"):
        return slots
    return max(slots, int(min(LINE_PIECES, max(1, -(-nbytes // LINE_CHUNK)))))


def _step(collective, algorithm, p, cluster, sim, flow, chunks=1):
    """(fn(rank) for simulate, real float32 elements standing for the size, rank -> want).
    chunks > 1: the tree all-reduces `chunks` parts at once, so they stream up and down it
    one behind the other (each port carries them in turn): a pipelined tree."""
    k = max(ELEMENTS_PER_RANK, -(-2 * chunks // p))  # two trees' halves of every chunk
    if collective == "all_reduce":
        channels = 1 if flow or algorithm != RINGS else cluster.nics
        n = p * k * channels
        want = sum((np.arange(n) + r) % VALUES for r in range(p)).astype(np.float32)

        def step(rank):
            x = ((np.arange(n) + rank) % VALUES).astype(np.float32)
            if algorithm == "nvls":
                all_reduce_nvls(x, nvls_seconds(sim))
            elif algorithm == NCCL_TREE:
                all_reduce_nccl_tree(x, cluster.per_node, chunks)
            elif chunks > 1:
                edges = layout.bounds(n, chunks)
                parts = [layout.chunk(x, edges, c) for c in range(chunks)]
                concurrently(
                    [lambda part=part: api.all_reduce(part, algorithm=algorithm) for part in parts]
                )
            elif algorithm == RINGS and not flow:
                all_reduce_rings(x, ring_groups(p, cluster.per_node, channels))
            else:
                api.all_reduce(x, algorithm="ring" if algorithm == RINGS else algorithm)
            return x

        return step, n, lambda r: want
    file_algorithm = "ring" if algorithm == RINGS and flow else algorithm
    if collective == "all_gather":
        full = np.concatenate([_block(r, k) for r in range(p)])

        def step(rank):
            out = np.zeros(p * k, np.float32)
            api.all_gather_into_tensor(out, _block(rank, k), algorithm=file_algorithm)
            return out

        return step, p * k, lambda r: full
    if collective == "reduce_scatter":
        total = sum(_block(r, p * k) for r in range(p)).astype(np.float32)

        def step(rank):
            out = np.zeros(k, np.float32)
            api.reduce_scatter_tensor(out, _block(rank, p * k), algorithm=file_algorithm)
            return out

        return step, p * k, lambda r: total[r * k : (r + 1) * k]
    raise ValueError(f"collective {collective!r}: choose all_reduce, all_gather, reduce_scatter")


def _block(rank: int, n: int):
    return ((np.arange(n) + rank) % VALUES).astype(np.float32)


def _predicted(collective, algorithm, protocol, nbytes, p, cluster):
    """NCCL's formula where a protocol is priced, else the cost model's closed form."""
    if protocol is not None:
        family = "ring" if algorithm == RINGS else algorithm
        return protocols.nccl_time(collective, family, protocol, nbytes, p, cluster)
    if collective != "all_reduce" or algorithm == "nvls":
        return None
    return predicted(algorithm, nbytes, p, cluster)


def predicted(algorithm: str, nbytes: float, p: int, cluster) -> float | None:
    """The cost model's seconds for this all-reduce on this cluster (None: no formula)."""
    nodes = -(-p // cluster.per_node)
    if algorithm == "hierarchical":
        if p % cluster.per_node:
            return None
        h = Hierarchy(_no_gamma(cluster.intra), _no_gamma(cluster.inter), cluster.per_node)
        return cost.all_reduce_on_cluster(nbytes, nodes, "hierarchical", h)
    slowest = cluster.inter if nodes > 1 else cluster.intra
    if algorithm == RINGS:  # the NICs' rate added up, unless NVLink's share is slower
        c = cluster.nics
        beta = max((c - 1) / c * cluster.intra.beta, cluster.inter.beta / c) if nodes > 1 else None
        slowest = Link("rings", slowest.alpha, beta or slowest.beta, 0.0)
        algorithm = "ring"
    try:
        return cost.predict("all_reduce", algorithm, nbytes, p, _no_gamma(slowest))
    except ValueError:
        return None


def _no_gamma(link: Link) -> Link:
    return Link(link.name, link.alpha, link.beta, 0.0, link.source)
