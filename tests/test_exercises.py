"""The exercises' tests: they grade solutions/ (default) or exercises/ (`pytest --impl=exercises`,
or `minipar grade`). Test names carry the exercise's file name (ex03_ring_allreduce, ...), which
is how `minipar grade 03` picks a lesson's tests."""

import math

import numpy as np
import pytest
from conftest import ranks_suite

from minipar import cost, exercises
from minipar.testing import harness

SUITE = ranks_suite("exercises.py")
SIZES = [1, 2, 3, 4]


@pytest.mark.parametrize("size,name", harness.params(SUITE, SIZES))
def test_ranks(size, name, exercise_impl):
    harness.run_suite(SUITE, size, "mpi").check(name)


# -- ex04: the alpha-beta fit (one process) --------------------------------------------------------


def ex04(impl: str):
    return exercises.load("ex04_alpha_beta_fit", impl)


def test_ex04_alpha_beta_fit_exact(exercise_impl):
    sizes = np.array([8, 1 << 10, 1 << 16, 1 << 20, 1 << 24], dtype=float)
    alpha, beta = ex04(exercise_impl).fit_alpha_beta(sizes, 5e-6 + sizes / 2e9)
    assert alpha == pytest.approx(5e-6, rel=1e-6), f"alpha {alpha}, want 5e-6"
    assert beta == pytest.approx(1 / 2e9, rel=1e-6), f"beta {beta}, want {1 / 2e9}"


def test_ex04_alpha_beta_fit_noisy_lists(exercise_impl):
    rng = np.random.default_rng(0)
    sizes = [float(1 << k) for k in range(3, 25)] * 3
    times = [(20e-6 + n / 5e9) * (1 + 0.02 * rng.standard_normal()) for n in sizes]
    alpha, beta = ex04(exercise_impl).fit_alpha_beta(sizes, times)  # plain lists work too
    want = np.linalg.lstsq(np.column_stack([np.ones(len(sizes)), sizes]), times, rcond=None)[0]
    assert (alpha, beta) == pytest.approx(tuple(want), rel=1e-9), "not the least-squares fit"
    assert beta == pytest.approx(1 / 5e9, rel=0.05)


@pytest.mark.parametrize("p", [1, 2, 3, 8])
def test_ex04_alpha_beta_fit_ring_time(exercise_impl, p):
    link = cost.Link("test", alpha=7e-6, beta=1 / 3e9, gamma=0.0)
    for nbytes in (8, 1 << 20, 1 << 30):
        got = ex04(exercise_impl).ring_all_reduce_time(link.alpha, link.beta, nbytes, p)
        want = cost.predict("all_reduce", "ring", nbytes, p, link)
        assert got == pytest.approx(want, rel=1e-12), f"p={p} n={nbytes}: {got}, want {want}"


@pytest.mark.parametrize("p", [2, 4, 8, 64])
def test_ex04_alpha_beta_fit_crossover(exercise_impl, p):
    link = cost.Link("test", alpha=20e-6, beta=1 / 5e9, gamma=0.0)
    got = ex04(exercise_impl).ring_beats_recursive_doubling(link.alpha, link.beta, p)
    want = cost.crossover("all_reduce", "recursive_doubling", "ring", p, link)
    if want is None:
        assert got == math.inf, f"p={p}: the ring never wins, expected math.inf, got {got}"
    else:
        assert got == pytest.approx(want, rel=2e-3), f"p={p}: {got}, cost.crossover says {want}"


# -- ex07: the 1F1B schedule (one process, minipar's verifier) ----------------------------------


def ex07(impl: str):
    return exercises.load("ex07_one_f_one_b", impl)


def test_ex07_one_f_one_b_verifies(exercise_impl):
    from minipar.parallel.pipeline import schedules as S
    from minipar.parallel.pipeline import verify as V

    for p in range(2, 9):
        for m in range(1, 17):
            compute = [ex07(exercise_impl).one_f_one_b(r, p, m) for r in range(p)]
            program = [S.with_comms(c, r, p, 1) for r, c in enumerate(compute)]
            report = V.verify(program)  # raises on a deadlock or a lost micro-batch
            want = [min(p - r, m) for r in range(p)]
            assert report.peak_in_flight == want, f"p={p} m={m}: peak {report.peak_in_flight}"
            assert report.bubble_fraction == pytest.approx((p - 1) / (m + p - 1)), (p, m)


def test_ex07_one_f_one_b_is_minipars(exercise_impl):
    from minipar.parallel.pipeline import schedules as S

    for p, m in ((4, 8), (4, 2), (3, 5)):
        for r in range(p):
            mine = S.with_comms(ex07(exercise_impl).one_f_one_b(r, p, m), r, p, 1)
            assert mine == S.instructions("1f1b", r, p, m), f"rank {r} of p={p}, m={m}"


# -- ex09: context parallelism (one process) ---------------------------------------------------


def ex09(name: str, impl: str):
    return exercises.load(name, impl)


def attention_blocks(cuts, scale=1.0, seed=0):
    """(q, k, v) and each block's (out, lse) from minipar's kernel, for keys cut at `cuts`."""
    import torch

    from minipar.parallel.context import online_softmax

    g = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(2, 3, 5, 8, generator=g)
    k = scale * torch.randn(2, 3, 16, 8, generator=g)
    v = torch.randn(2, 3, 16, 8, generator=g)
    edges = [0, *cuts, 16]
    blocks = [
        online_softmax.block_attention(q, k[:, :, a:b], v[:, :, a:b])
        for a, b in zip(edges, edges[1:])
    ]
    return q, k, v, blocks


@pytest.mark.parametrize("cuts", [[1], [8], [15], [3, 7, 12]])
def test_ex09_online_softmax_merge_is_attention_over_all_keys(exercise_impl, cuts):
    import torch
    from torch.nn import functional as F

    merge = ex09("ex09_online_softmax_merge", exercise_impl).merge
    q, k, v, blocks = attention_blocks(cuts)
    out, lse = blocks[0]
    for block in blocks[1:]:
        out, lse = merge(out, lse, *block)
    want = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6, msg="merged output")
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), msg="merged lse")


def test_ex09_online_softmax_merge_scores_in_the_hundreds(exercise_impl):
    """exp(lse) overflows float32 here: only a merge rescaled by the running maximum stays
    finite."""
    import torch
    from torch.nn import functional as F

    merge = ex09("ex09_online_softmax_merge", exercise_impl).merge
    q, k, v, blocks = attention_blocks([8], scale=8.0)
    assert blocks[0][1].max() > 100, "the test needs scores past exp's float32 range"
    out, lse = merge(*blocks[0], *blocks[1])
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "inf or NaN: rescale by m"
    want = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


def test_ex09_online_softmax_merge_empty_blocks(exercise_impl):
    """A block with every key masked (lse = -inf, out = 0) contributes nothing; two of them stay
    empty, with no NaN."""
    import torch

    merge = ex09("ex09_online_softmax_merge", exercise_impl).merge
    _, _, _, blocks = attention_blocks([8])
    out, lse = blocks[0]
    empty = (torch.zeros_like(out), torch.full_like(lse, float("-inf")))
    for merged in (merge(out, lse, *empty), merge(*empty, out, lse)):
        torch.testing.assert_close(merged[0], out, msg="out after merging an empty block")
        torch.testing.assert_close(merged[1], lse, msg="lse after merging an empty block")
    both = merge(*empty, *empty)
    assert not torch.isnan(both[0]).any() and not torch.isnan(both[1]).any(), "NaN"
    assert torch.equal(both[0], empty[0]) and torch.isneginf(both[1]).all(), both


@pytest.mark.parametrize("cp", range(1, 9))
def test_ex09_load_balanced_split_chunks(exercise_impl, cp):
    """Every rank's chunks, as minipar's layout; every token once; the same causal work."""
    import torch

    from minipar.parallel.context import layout

    split = ex09("ex09_load_balanced_split", exercise_impl)
    held = [split.chunks_of(r, cp) for r in range(cp)]
    assert sorted(c for pair in held for c in pair) == list(range(2 * cp)), held
    seq = 4 * cp
    work = []
    for r in range(cp):
        assert tuple(held[r]) == (r, 2 * cp - 1 - r), f"rank {r} of cp={cp}: {held[r]}"
        mine = split.split(torch.arange(seq), 0, r, cp)
        assert mine.tolist() == layout.positions(r, cp, seq, causal=True).tolist(), (r, mine)
        work.append(int((mine + 1).sum()))
    assert len(set(work)) == 1, f"causal work per rank {work}: not balanced"


def test_ex09_load_balanced_split_any_dim_and_bad_length(exercise_impl):
    import torch

    from minipar.parallel.context import layout

    split = ex09("ex09_load_balanced_split", exercise_impl)
    x = torch.randn(2, 3, 24, 5)
    for dim in (2, -2):
        for r in range(3):
            want = x.index_select(2, layout.positions(r, 3, 24, causal=True))
            assert torch.equal(split.split(x, dim, r, 3), want), (dim, r)
    with pytest.raises(ValueError, match="20") as error:
        split.split(torch.randn(20), 0, 0, 3)
    assert "6" in str(error.value), f"name 2cp = 6 in the message: {error.value}"


# -- ex10: the MoE dispatch (one process; tests/ranks/exercises_ex10.py plugs it into MoE) ------


def ex10(impl: str):
    return exercises.load("ex10_moe_dispatch", impl)


def test_ex10_moe_dispatch_by_hand(exercise_impl):
    import torch

    mod = ex10(exercise_impl)
    experts = torch.tensor([[2, 0], [1, 3], [0, 1], [3, 2]])
    kept = torch.ones(4, 2, dtype=torch.bool)
    order, counts = mod.sort_by_expert(experts, kept, 4)
    assert order.tolist() == [1, 4, 2, 5, 0, 7, 3, 6], f"order {order.tolist()}"
    assert counts.tolist() == [2, 2, 2, 2], f"counts {counts.tolist()}"
    assert mod.split_sizes(counts, 2) == [4, 4]
    assert mod.split_sizes(torch.tensor([2, 1, 0, 3]), 2) == [3, 3]
    assert mod.split_sizes(torch.tensor([2, 1, 0, 3]), 4) == [2, 1, 0, 3]
    assert mod.inverse_permutation(order).tolist() == [4, 0, 2, 6, 1, 3, 7, 5]
    kept[2, 0] = kept[0, 1] = False  # t2's e0 and t0's e0 dropped: last, in copy order
    order, counts = mod.sort_by_expert(experts, kept, 4)
    assert order.tolist() == [2, 5, 0, 7, 3, 6, 1, 4], f"with drops: order {order.tolist()}"
    assert counts.tolist() == [0, 2, 2, 2], f"with drops: counts {counts.tolist()}"


@pytest.mark.parametrize("t,k,e,p", [(12, 2, 4, 2), (30, 1, 8, 4), (7, 2, 6, 3), (0, 2, 4, 2)])
def test_ex10_moe_dispatch_random_routings(exercise_impl, t, k, e, p):
    """Properties first (a permutation, keys in order, stable, drops last), then exactly
    minipar's own dispatch."""
    import torch

    from minipar.parallel.expert import dispatch

    mod = ex10(exercise_impl)
    gen = torch.Generator().manual_seed(t * 100 + e)
    experts = torch.rand(t, e, generator=gen).topk(k, -1).indices  # k distinct experts each
    kept = torch.rand(t, k, generator=gen) < 0.8
    order, counts = mod.sort_by_expert(experts, kept, e)
    assert sorted(order.tolist()) == list(range(t * k)), "order is not a permutation of copies"
    key = torch.where(kept, experts, e).reshape(-1)[order].tolist()
    assert key == sorted(key), "copies are not sorted by expert (dropped copies last)"
    for a, b in zip(range(t * k), range(1, t * k)):
        if key[a] == key[b]:
            assert order[a] < order[b], f"not stable: copies {order[a]}, {order[b]} swapped"
    want_order, want_counts = dispatch.sort_by_expert(experts, kept, e)
    assert torch.equal(order, want_order) and torch.equal(counts, want_counts), (
        f"counts {counts.tolist()}, want {want_counts.tolist()}"
    )
    assert mod.split_sizes(counts, p) == dispatch.split_sizes(counts, p)
    inverse = mod.inverse_permutation(order)
    assert torch.equal(order[inverse], torch.arange(t * k)), "order[inverse] is not 0, 1, ..."
    assert torch.equal(inverse[order], torch.arange(t * k)), "inverse[order] is not 0, 1, ..."


# -- ex11: one ring per NIC (one process; the rings run on a simulated cluster) -------------------


def ex11(impl: str):
    return exercises.load("ex11_nccl_rings", impl)


@pytest.mark.parametrize("size,per_node,channels", [(8, 4, 1), (8, 4, 2), (16, 8, 8), (11, 4, 4)])
def test_ex11_nccl_rings_orders(exercise_impl, size, per_node, channels):
    from minipar.simulate import rings

    got = ex11(exercise_impl).ring_orders(size, per_node, channels)
    assert got == rings.ring_orders(size, per_node, channels), got
    for c, order in enumerate(got):
        assert sorted(order) == list(range(size)), f"ring {c} does not hold every rank once"
    leaving = [order[per_node - 1] for order in got]  # the GPU each ring leaves node 0 from
    assert len(set(leaving)) == channels, f"rings share a NIC on their way out: {leaving}"


def test_ex11_nccl_rings_bad_channels(exercise_impl):
    for channels in (0, 9):
        with pytest.raises(ValueError, match=str(channels)):
            ex11(exercise_impl).ring_orders(16, 8, channels)


def test_ex11_nccl_rings_on_a_simulated_cluster(exercise_impl):
    from minipar import runtime
    from minipar.collectives import api
    from minipar.simulate.cluster import preset
    from minipar.simulate.rings import all_reduce_rings
    from minipar.simulate.runner import simulate

    h100, size, n = preset("h100"), 16, 16 * 8
    orders = ex11(exercise_impl).ring_orders(size, 8, 8)

    def many(rank):
        x = np.full(n, float(rank))
        all_reduce_rings(x, [runtime.new_group(order) for order in orders])
        return x

    def one(rank):
        x = np.full(n, float(rank))
        api.all_reduce(x, algorithm="ring")
        return x

    scale = (1 << 30) / (8 * n)  # each float64 stands for enough bytes to make 1 GiB
    fast, slow = simulate(many, size, h100, scale), simulate(one, size, h100, scale)
    assert all((x == size * (size - 1) / 2).all() for x in fast.results)
    assert slow.time > 5 * fast.time, f"one ring {slow.time:.4g} s, your rings {fast.time:.4g} s"


# -- ex12: the checkpoint interval (one process) ---------------------------------------------------


def ex12(impl: str):
    return exercises.load("ex12_checkpoint_interval", impl)


def test_ex12_checkpoint_interval_mtbi_from_llama3(exercise_impl):
    # 419 interruptions in 54 days on 16,384 GPUs: every 54 x 24 / 419 = 3.093 hours
    got = ex12(exercise_impl).mtbi_seconds(419, 54, 16384, 16384)
    assert got == pytest.approx(54 * 86400 / 419, rel=1e-9)
    assert ex12(exercise_impl).mtbi_seconds(419, 54, 16384, 1024) == pytest.approx(16 * got)


@pytest.mark.parametrize("save,mtbi", [(10.0, 11130.0), (60.0, 3600.0), (300.0, 40000.0)])
def test_ex12_checkpoint_interval_is_the_minimum(exercise_impl, save, mtbi):
    mod = ex12(exercise_impl)
    tau = mod.best_interval(save, mtbi)
    assert tau == pytest.approx(math.sqrt(2 * save * mtbi), rel=1e-9)
    assert mod.waste(tau, save, 600.0, mtbi) == pytest.approx(
        save / tau + (600.0 + tau / 2) / mtbi, rel=1e-9
    )
    for other in (0.5 * tau, 0.9 * tau, 1.1 * tau, 2 * tau):  # the minimum, seen from both sides
        assert mod.waste(other, save, 600.0, mtbi) > mod.waste(tau, save, 600.0, mtbi)


def test_ex12_checkpoint_interval_goodput_is_lesson_12s(exercise_impl):
    from minipar.course.lessons import l12_failures_at_scale as l12

    mod, m = ex12(exercise_impl), l12.mtbi_hours(16384) * 3600
    for save in l12.SAVE_COSTS:
        want = l12.goodput(l12.young_daly(save, m), save, l12.RESTART_S, m)
        assert mod.goodput(save, l12.RESTART_S, m) == pytest.approx(want, rel=1e-9)
    assert mod.goodput(3000.0, 3000.0, 3600.0) == 0.0  # more is lost than the clock has
