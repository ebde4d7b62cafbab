"""The pipelined two-level all-reduce (minipar/collectives/pipelined.py) on the simulated
cluster: bitwise hierarchical.py's result, its bytes per link (the formula written here), on
3 nodes of 2 and 2 nodes of 3, sizes the pieces do not divide; its cost function against a
hand-worked case."""

from __future__ import annotations

import numpy as np
import pytest

import minipar
from minipar import cost
from minipar.collectives import api, registry
from minipar.cost.links import Link
from minipar.simulate import cluster as clusters
from minipar.simulate.runner import simulate

LINK = Link("sim", 1e-6, 1e-9, 0.0)
SLOW = Link("slow", 1e-6, 1e-8, 0.0)  # between nodes: the pipeline wants several pieces


def chunk_sizes(n: int, p: int) -> list[int]:
    """layout.bounds' rule written out: the first n % p chunks one element longer."""
    return [n // p + (1 if c < n % p else 0) for c in range(p)]


def link_bytes(n: int, N: int, k: int, rank: int) -> tuple[int, int]:
    """(inside, between) bytes rank sends in a two-level all-reduce of n float64: inside, every
    chunk but its own (reduce-scatter) and every chunk but its right neighbour's (all-gather);
    across, the same two rules on its chunk's N sub-chunks."""
    j, b = rank % k, rank // k
    inside = chunk_sizes(n, k)
    sub = chunk_sizes(inside[j], N)
    rs_in = sum(inside) - inside[j]
    ag_in = sum(inside) - inside[(j + 1) % k]
    rs_x = sum(sub) - sub[b]
    ag_x = sum(sub) - sub[(b + 1) % N]
    return 8 * (rs_in + ag_in), 8 * (rs_x + ag_x)


@pytest.mark.parametrize("N,k", [(3, 2), (2, 3)])
def test_bitwise_hierarchical_and_bytes_per_link(N, k):
    p = N * k
    sizes = [1, 6 * p + 5, 4099]  # fewer elements than ranks; uneven by ranks and by pieces

    def step(rank):
        cost.set_inter_link(SLOW)
        out = []
        for n in sizes:
            x = np.random.default_rng(rank * 7 + n).standard_normal(n)
            a, b = x.copy(), x.copy()
            api.all_reduce(a, algorithm="hierarchical")
            with minipar.trace() as t:
                api.all_reduce(b, algorithm="hierarchical_pipelined")
            assert a.tobytes() == b.tobytes(), f"n={n} rank {rank}: not bitwise hierarchical's"
            sends = [m for m in t.messages if m.kind == "send" and m.rank == rank]
            inside = sum(m.nbytes for m in sends if m.peer // k == rank // k)
            across = sum(m.nbytes for m in sends if m.peer // k != rank // k)
            out.append((inside, across))
            steps = max(m.step for m in sends) + 1
            R = max(2 * (k - 1), 2 * (N - 1))  # a tick's steps; the last tick only gathers
            C = min(cost.pipeline_chunks(8 * n, N, k), n // p) if n >= p else 1
            assert steps == (C + 1) * R + 2 * (k - 1), f"n={n} rank {rank}: {steps} steps"
        return out

    run = simulate(step, p, clusters.custom(LINK, k))
    for rank, got in enumerate(run.results):
        assert got == [link_bytes(n, N, k, rank) for n in sizes], f"rank {rank} on {N}x{k}"
    assert cost.pipeline_chunks(8 * 4099, N, k, LINK, SLOW) > 1  # the big one was pipelined


def test_cost_function_hand_worked():
    """2 nodes of 2, S = 8 MB in C = 4 pieces: s = 2 MB. Inside (alpha 1 us, beta 1 ns/B, no
    gamma): reduce-scatter's bytes = 1/2 x 2 MB x 1 ns = 1000 us; the all-gather's the same.
    Across (alpha 10 us, beta 10 ns/B; 2 ranks share one cable: x2): 2 x 1/2 x (2 MB / 2) x
    10 ns x 2 = 20000 us. The alphas, paid one after the other by the thread that posts every
    stage's messages: 4 pieces x (2 steps inside x 2 messages x 1 us + 2 steps across x 10 us)
    = 96 us. T = 96 + 1000 + 20000 + 1000 + 3 x max(2000, 20000) = 82096 us."""
    intra, inter = Link("in", 1e-6, 1e-9, 0.0), Link("x", 1e-5, 1e-8, 0.0)
    got = cost.pipelined_all_reduce(8e6, 2, 2, 4, intra, inter)
    assert got == pytest.approx(82096e-6, rel=1e-12)
    # more pieces shorten the link's idle start, until alphas dominate: the best is in between
    best = cost.pipeline_chunks(8e6, 2, 2, intra, inter)
    assert 1 < best < cost.model.MAX_CHUNKS


def two_level_time(S, N, k, intra, inter):
    """hierarchical.py's all-reduce, written out: a ring inside (2 (k-1) steps, 2 (k-1)/k S
    sent, (k-1)/k S reduced), then a ring across on S/k from all k ranks of a node at once on
    one cable (2 (N-1) steps, 2 (N-1)/N S/k sent each: k times that on the cable)."""
    inside = 2 * (k - 1) * intra.alpha + (k - 1) / k * S * (2 * intra.beta + intra.gamma)
    across = 2 * (N - 1) * inter.alpha + (N - 1) / N * S / k * (2 * k * inter.beta + intra.gamma)
    return inside + across


def piped_time(S, N, k, intra, inter):
    """pipelined.py's, best over 1..64 pieces: every piece's messages' alphas one after the
    other (one thread posts them all: N a step inside), its bytes as a three-stage pipeline."""
    best = None
    for C in range(1, 65):
        s = S / C
        alphas = C * (2 * (k - 1) * N * intra.alpha + 2 * (N - 1) * inter.alpha)
        rs = (k - 1) / k * s * (intra.beta + intra.gamma)
        ag = (k - 1) / k * s * intra.beta
        across = (N - 1) / N * s / k * (2 * k * inter.beta + intra.gamma)
        t = alphas + rs + across + ag + (C - 1) * max(rs + ag, across)
        best = t if best is None else min(best, t)
    return best


@pytest.mark.parametrize("N,k", [(2, 2), (2, 3), (3, 2)])
def test_auto_takes_the_pipelined_one_only_where_it_is_priced_faster(N, k):
    """`auto` on a node map (registry.auto_choice: what every rank computes from the shape and
    the two links, no message): on N x k nodes with an emulated node's links (shared memory
    inside, 2 Gbit/s between), the plain two-level all-reduce at 1 MiB, the pipelined one at
    64 MiB, each as the formulas written here say; on one node neither."""
    intra = cost.SHARED_MEMORY
    inter = Link("2 Gbit/s", 50e-6, 1 / 0.25e9, 1 / 5e9)
    want = {}
    for S in (1 << 20, 64 << 20):
        faster = piped_time(S, N, k, intra, inter) < two_level_time(S, N, k, intra, inter)
        want[S] = "hierarchical_pipelined" if faster else "hierarchical"
        got = registry.auto_choice("all_reduce", S, N * k, (N, k), (intra, inter))
        assert got == want[S], f"{S} B on {N}x{k}: auto chose {got}, the formulas {want[S]}"
        alone = registry.auto_choice("all_reduce", S, N * k, None, (intra, None))
        assert not alone.startswith("hierarchical"), f"{S} B on one node: {alone}"
    assert want == {1 << 20: "hierarchical", 64 << 20: "hierarchical_pipelined"}, want
