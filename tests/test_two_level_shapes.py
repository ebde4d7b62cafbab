"""The two-level collectives (minipar/collectives/hierarchical.py) and the two-link cost model
(minipar/cost/model.py) on nodes where a node's size is not the number of nodes: 3 nodes of 2,
2 nodes of 3, and unequal nodes (2 + 2 + 1, 3 + 2), on the simulated cluster (one process, the
unchanged collectives; its node map is per_node consecutive ranks a node).

Expected steps and bytes are the table of hierarchical.py's docstring written out here for N
nodes of k ranks, counted from the messages themselves (whose node is peer // k, computed
here); the copies the two-level all-gather makes are counted at buffers.copy_; `auto` is asked
on each shape with a slow link between nodes."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

import minipar
from minipar import cost
from minipar.collectives import api, hierarchical
from minipar.comm.transport import buffers
from minipar.cost.links import Link
from minipar.simulate import cluster as clusters
from minipar.simulate.runner import simulate
from minipar.state import process

LINK = Link("sim", 1e-6, 1e-9, 0.0)
SHAPES = [(3, 2), (2, 3)]  # (nodes, ranks a node): N != k both ways
SEG = (1 << 18) // 8  # float64 elements in one 256 KiB segment of the pipelined chain


def expected(collective: str, N: int, k: int, S: float) -> tuple[int, float, float]:
    """(steps, bytes the busiest rank sends inside its node, bytes it sends between nodes),
    hierarchical.py's table: S the buffer's bytes (an all-gather's output, a reduce-scatter's
    input), n = S / p one rank's block."""
    p = N * k
    if collective == "all_reduce":
        return 2 * (k - 1) + 2 * (N - 1), 2 * (k - 1) / k * S, 2 * (N - 1) / N * S / k
    if collective == "reduce_scatter":
        return (k - 1) + (N - 1), (k - 1) / k * S, (N - 1) / N * S / k
    if collective == "all_gather":
        return (N - 1) + (k - 1), (k - 1) / k * S, (N - 1) * S / p
    segments = math.ceil(S / 8 / SEG)  # broadcast: a chain across the leaders, then inside
    return (segments + N - 2) + (segments + k - 2), S, S


def run_one(collective: str, algorithm: str, p: int, elements: int, rank: int):
    """One call on float64 data; returns (result, what numpy says it must be)."""
    rng = [np.random.default_rng(q).integers(-9, 9, p * elements) for q in range(p)]
    mine = rng[rank].astype(np.float64)
    if collective == "all_reduce":
        api.all_reduce(mine, algorithm=algorithm)
        return mine, sum(r.astype(np.float64) for r in rng)
    if collective == "reduce_scatter":
        out = np.empty(elements)
        api.reduce_scatter_tensor(out, mine, algorithm=algorithm)
        return out, sum(r[rank * elements : (rank + 1) * elements] for r in rng)
    if collective == "all_gather":
        out = np.empty(p * elements)
        api.all_gather_into_tensor(out, mine[:elements].copy(), algorithm=algorithm)
        return out, np.concatenate([r[:elements] for r in rng]).astype(np.float64)
    root = p - 2  # not the first rank of its node
    api.broadcast(mine, root, algorithm=algorithm)
    return mine, rng[root].astype(np.float64)


def traced(collective: str, algorithm: str, p: int, k: int, elements: int):
    """Run the call on p simulated ranks, k a node; every message of every rank."""

    def step(rank):
        got, want = run_one(collective, algorithm, p, elements, rank)
        assert np.array_equal(got, want), f"{collective} {algorithm} rank {rank}: wrong result"

    with minipar.trace() as t:
        simulate(step, p, clusters.custom(LINK, k))
    return t.messages


def per_rank(messages, p: int, k: int):
    """(steps of the call, max bytes sent inside a node, max bytes sent between nodes)."""
    sends = [m for m in messages if m.kind == "send"]
    inside = [
        sum(m.nbytes for m in sends if m.rank == r and m.peer // k == r // k) for r in range(p)
    ]
    across = [
        sum(m.nbytes for m in sends if m.rank == r and m.peer // k != r // k) for r in range(p)
    ]
    return max(m.step for m in sends) + 1, max(inside), max(across)


@pytest.mark.parametrize("N,k", SHAPES)
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather", "broadcast"])
def test_steps_and_bytes_by_link_are_the_table(collective, N, k):
    p = N * k
    elements = 3 * SEG // p + 1 if collective == "broadcast" else 60  # broadcast: 4 segments
    S = 8.0 * p * elements
    got = per_rank(traced(collective, "hierarchical", p, k, elements), p, k)
    assert got == expected(collective, N, k, S), f"{collective} on {N} nodes of {k}"
    # the two-link cost model counts the same
    inside, between = cost.traffic_on_nodes(collective, "hierarchical", S, N, k)
    assert (inside.steps + between.steps, inside.bytes_sent, between.bytes_sent) == got


@pytest.mark.parametrize("p,k", [(5, 2), (5, 3)])  # nodes of 2 + 2 + 1, of 3 + 2
def test_unequal_nodes_take_the_flat_ring_and_auto_stays_flat(p, k):
    """No common position to pair ranks by: all-reduce, reduce-scatter and all-gather are the
    flat ring's steps and bytes (2 (p-1) steps, 2 (p-1)/p S); broadcast stays two-level and
    right; `auto` never picks the two-level schemes there, even on a slow link between."""
    for collective, steps, share in (
        ("all_reduce", 2 * (p - 1), 2 * (p - 1) / p),
        ("reduce_scatter", p - 1, (p - 1) / p),
        ("all_gather", p - 1, (p - 1) / p),
    ):
        messages = traced(collective, "hierarchical", p, k, 60)
        sends = [m for m in messages if m.kind == "send"]
        busiest = max(sum(m.nbytes for m in sends if m.rank == r) for r in range(p))
        assert (max(m.step for m in sends) + 1, busiest) == (steps, share * 8 * 60 * p)
    traced("broadcast", "hierarchical", p, k, 100)
    assert not auto_choice(p, k).startswith("hierarchical")  # plain or pipelined


SLOW = Link("between nodes", 50e-6, 1 / 0.25e9, 1 / 5e9)  # 2 Gbit/s, far below SHARED_MEMORY


def auto_choice(p: int, k: int, nbytes: int = 8 << 20) -> str:
    """The algorithm `auto` takes for an all-reduce of nbytes on p simulated ranks, k a node;
    the (nodes, ranks a node) it priced is checked on the way."""
    picked = []
    N, even = -(-p // k), p % k == 0
    shape = (N, k) if even and N > 1 else None  # unequal nodes, or one: no two-level shape

    def step(rank):
        assert hierarchical.shape(process.world) == shape, hierarchical.shape(process.world)
        x = np.ones(nbytes // 8)
        with minipar.trace() as t:
            api.all_reduce(x, algorithm="auto")
        picked.append(t.calls[-1].algorithm)

    cost.set_inter_link(SLOW)
    try:
        simulate(step, p, clusters.custom(LINK, k))
    finally:
        cost.set_inter_link(None)
    assert len(set(picked)) == 1, picked
    return picked[0]


@pytest.mark.parametrize("N,k", SHAPES)
def test_auto_takes_two_levels_across_slow_nodes(N, k):
    """A large all-reduce with a link between nodes 20x slower than inside: the two-level
    scheme puts 2 (N-1)/N S on a node's link against the flat ring's 2 (p-1)/p S, and its
    steps across are 2 (N-1) instead of 2 (p-1): `auto` must take it (plain or pipelined:
    which, test_pipelined_two_level.py); on one node neither."""
    two_level = ("hierarchical", "hierarchical_pipelined")
    assert auto_choice(N * k, k) in two_level
    assert auto_choice(N * k, N * k) not in two_level


@pytest.mark.parametrize("N,k", SHAPES)
def test_the_two_level_all_gathers_copies(N, k, monkeypatch):
    """The busiest rank's local copies: its own block into the scratch (S/p), then the whole
    output back into rank order (S). The cost model's bytes_copied says the same."""
    p, elements = N * k, 10
    S = 8.0 * p * elements
    copied = [0] * p
    real_copy = buffers.copy_

    def counting(dst, src):
        caller = sys._getframe(1).f_globals["__name__"]
        if caller in ("minipar.collectives.hierarchical", "minipar.collectives.ring"):
            copied[minipar.get_rank()] += buffers.nbytes(src)
        return real_copy(dst, src)

    monkeypatch.setattr(buffers, "copy_", counting)
    traced("all_gather", "hierarchical", p, k, elements)
    assert copied == [S / p + S] * p
    inside, between = cost.traffic_on_nodes("all_gather", "hierarchical", S, N, k)
    assert inside.bytes_copied + between.bytes_copied == S / p + S


@pytest.mark.parametrize("N,k", SHAPES)
def test_two_link_prices_by_hand(N, k):
    """predict_on_nodes for the two-level all-reduce, worked out: inside on the fast link, the
    k ranks of a node crossing at once on one cable (k times one rank's bytes), reductions at
    the fast link's gamma; with a NIC per rank, one rank's bytes."""
    fast, slow, S = Link("in", 2e-6, 1e-10, 3e-10), Link("out", 40e-6, 4e-9, 9.0), 6e6
    inside = 2 * (k - 1) * fast.alpha + 2 * (k - 1) / k * S * fast.beta
    inside += (k - 1) / k * S * fast.gamma
    shard = S / k
    for nics, share in ((1, k), (k, 1)):
        across = 2 * (N - 1) * slow.alpha + 2 * (N - 1) / N * shard * share * slow.beta
        across += (N - 1) / N * shard * fast.gamma
        got = cost.predict_on_nodes("all_reduce", "hierarchical", S, N, k, fast, slow, nics)
        assert got == pytest.approx(inside + across, rel=1e-12), (N, k, nics)
    p = N * k  # the flat ring: every step waits for a hop between nodes, one rank a node
    ring = 2 * (p - 1) * slow.alpha + 2 * (p - 1) / p * S * slow.beta
    ring += (p - 1) / p * S * fast.gamma
    got = cost.predict_on_nodes("all_reduce", "ring", S, N, k, fast, slow)
    assert got == pytest.approx(ring, rel=1e-12)
