"""The exercises' tests: they grade solutions/ (default) or exercises/ (`pytest --impl=exercises`,
or `minipar grade`). Test names carry the exercise's file name (ex03_ring_allreduce, ...), which
is how `minipar grade 03` picks a lesson's tests."""

import math
import os

import numpy as np
import pytest
from conftest import ranks_suite

from minipar import cost
from minipar.cli import grade
from minipar.course import sandbox
from minipar.testing import harness

SUITE = ranks_suite("exercises.py")
SIZES = [1, 2, 3, 4]


# -- ex04: the alpha-beta fit (one process) --------------------------------------------------------


def ex04(impl: str):
    return sandbox.exercise("ex04_alpha_beta_fit", impl)


def test_ex04_alpha_beta_fit_exact(exercise_impl):
    sizes = np.array([8, 1 << 10, 1 << 16, 1 << 20, 1 << 24], dtype=float)
    alpha, beta = ex04(exercise_impl).fit_alpha_beta(sizes, 5e-6 + sizes / 2e9)
    what = "fit_alpha_beta on 5 exact points t = 5e-6 + n / 2e9"
    assert alpha == pytest.approx(5e-6, rel=1e-6), f"{what}: alpha yours {alpha:.6g}, want 5e-06"
    assert beta == pytest.approx(1 / 2e9, rel=1e-6), f"{what}: beta yours {beta:.6g}, want 5e-10"


def test_ex04_alpha_beta_fit_noisy_lists(exercise_impl):
    rng = np.random.default_rng(0)
    sizes = [float(1 << k) for k in range(3, 25)] * 3
    times = [(20e-6 + n / 5e9) * (1 + 0.02 * rng.standard_normal()) for n in sizes]
    alpha, beta = ex04(exercise_impl).fit_alpha_beta(sizes, times)  # plain lists work too
    want = np.linalg.lstsq(np.column_stack([np.ones(len(sizes)), sizes]), times, rcond=None)[0]
    assert (alpha, beta) == pytest.approx(tuple(want), rel=1e-9), (
        f"fit_alpha_beta on 66 noisy points: yours alpha {alpha:.6g}, beta {beta:.6g}; the least-"
        f"squares fit alpha {want[0]:.6g}, beta {want[1]:.6g}"
    )
    assert beta == pytest.approx(1 / 5e9, rel=0.05)


@pytest.mark.parametrize("p", [1, 2, 3, 8])
def test_ex04_alpha_beta_fit_ring_time(exercise_impl, p):
    link = cost.Link("test", alpha=7e-6, beta=1 / 3e9, gamma=0.0)
    for nbytes in (8, 1 << 20, 1 << 30):
        got = ex04(exercise_impl).ring_all_reduce_time(link.alpha, link.beta, nbytes, p)
        want = cost.predict("all_reduce", "ring", nbytes, p, link)
        assert got == pytest.approx(want, rel=1e-12), (
            f"ring_all_reduce_time(alpha=7e-6, beta=1/3e9, nbytes={nbytes}, p={p}): yours "
            f"{got:.6g} s, minipar.cost says {want:.6g} s (2 (p-1) steps of alpha, 2 (p-1)/p n "
            "bytes of beta)"
        )


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
    return sandbox.exercise("ex07_one_f_one_b", impl)


def _short(ins) -> str:
    return f"{type(ins).__name__}({ins.mb})" if ins is not None else "nothing (the list ends)"


def _first_difference(mine: list, ref: list) -> int | None:
    for i in range(max(len(mine), len(ref))):
        a = mine[i] if i < len(mine) else None
        b = ref[i] if i < len(ref) else None
        if a != b:
            return i
    return None


def _words(error) -> str:
    """The verifier's message, its mailbox slots ('act', 1, 1) put into words."""
    import re

    def slot(match):
        kind, mb, stage = match.groups()
        what = "activation" if kind == "act" else "gradient"
        return f"the {what} of micro-batch {mb} for stage {stage}"

    return re.sub(r"\('(act|grad)', (\d+), (\d+)\)", slot, str(error))


def ex07_grid():
    return [(p, m) for p in range(2, 9) for m in range(1, 17)]


def _warmed(k: int, m: int) -> list:
    """1F1B's order after k warm-up forwards (k = min(p - r - 1, m) is 1F1B's own)."""
    from minipar.parallel.pipeline.schedules import Backward, Forward

    order = [Forward(i) for i in range(k)]
    for i in range(m - k):
        order += [Forward(k + i), Backward(i)]
    return order + [Backward(i) for i in range(m - k, m)]


def _ex07_slip(one_f_one_b, p: int, m: int, r: int) -> str:
    """Two lines naming the slip when rank r's list is a known one ('' if not): GPipe's order
    (on every rank of the grid: at p=2 m=2 it is also one warm-up forward too many), or 1F1B
    with the wrong number of warm-up forwards, and what that costs in memory or in bubble."""
    try:
        return _slip_of(one_f_one_b, p, m, r)
    except Exception:  # a list that breaks the diagnosis: the plain message says the rest
        return ""


def _slip_of(one_f_one_b, p: int, m: int, r: int) -> str:
    from minipar.parallel.pipeline import schedules as S
    from minipar.parallel.pipeline import verify as V

    def gpipe(n):
        return [S.Forward(i) for i in range(n)] + [S.Backward(i) for i in range(n)]

    ref, mine = _warmed(min(p - r - 1, m), m), list(one_f_one_b(r, p, m))
    if mine == ref:
        return ""
    grid = [(q, n, k) for q, n in ex07_grid() for k in range(q)]
    if all(list(one_f_one_b(k, q, n)) == gpipe(n) for q, n, k in grid):
        return (
            "this is GPipe's order: all forwards first, then all backwards; 1F1B runs "
            "min(p - r - 1, m) warm-up forwards, then one forward, one backward\n"
            f"(p={p} m={m}: rank {r} holds all {m} micro-batches' activations, 1F1B's "
            f"{min(p - r, m)}; the bubble is the same)\n"
        )
    w = min(p - r - 1, m)
    k = next((k for k in range(-1, m + 1) if mine == _warmed(k, m)), None)  # -1: F(-1) first
    if k is None:
        return ""
    slip = {1: "one too many", -1: "one too few"}.get(k - w) or (
        f"{abs(k - w)} too {'many' if k > w else 'few'}"
    )
    head = (
        f"rank {r} does {k} warm-up forwards, 1F1B does min(p - r - 1, m) = {w} "
        f"(p={p} m={m}): {slip}\n"
    )
    try:
        report = V.verify([S.with_comms(one_f_one_b(q, p, m), q, p, 1) for q in range(p)], m=m, v=1)
    except V.ScheduleError as error:
        return head + f"(and the verifier rejects it: {_words(error)})\n"
    bubble, held = (p - 1) / (m + p - 1), report.peak_in_flight[r]
    if k < w:
        return head + (
            f"(the bubble becomes {report.bubble_fraction:.4f} of the time instead of "
            f"(p-1)/(m+p-1) = {bubble:.4f}: its backwards wait on gradients not yet sent)\n"
        )
    return head + (
        f"(rank {r} holds {held} micro-batches' activations instead of {min(p - r, m)}, for a "
        f"bubble no smaller: {report.bubble_fraction:.4f}, 1F1B's {bubble:.4f})\n"
    )


def test_ex07_one_f_one_b_order(exercise_impl):
    """Exactly 1F1B's compute order (the docstring's contract), on every rank of every (p, m):
    the first instruction where yours differs from minipar's own, by index."""
    from minipar.parallel.pipeline import schedules as S

    one_f_one_b = ex07(exercise_impl).one_f_one_b
    for p, m in ex07_grid():
        for r in range(p):
            mine = list(one_f_one_b(r, p, m))
            ref = [i for i in S.instructions("1f1b", r, p, m) if type(i) in (S.Forward, S.Backward)]
            i = _first_difference(mine, ref)
            if i is None:
                continue
            yours = _short(mine[i] if i < len(mine) else None)
            theirs = _short(ref[i] if i < len(ref) else None)
            raise AssertionError(
                _ex07_slip(one_f_one_b, p, m, r)
                + f"p={p} m={m}, rank {r}, instruction {i}: yours {yours}, the reference {theirs} "
                f"(yours: {_letters(mine)}; the reference: {_letters(ref)}; F = Forward, "
                "B = Backward, then the micro-batch)"
            )


def _letters(order) -> str:
    return " ".join(f"{type(x).__name__[0]}{x.mb}" for x in order)


def test_ex07_one_f_one_b_verifies(exercise_impl):
    """minipar's verifier runs every rank's list with its messages: no deadlock, every message
    received, every micro-batch forward and backward; then the peak and the bubble."""
    from minipar.parallel.pipeline import schedules as S
    from minipar.parallel.pipeline import verify as V

    for p, m in ex07_grid():
        compute = [ex07(exercise_impl).one_f_one_b(r, p, m) for r in range(p)]
        program = [S.with_comms(c, r, p, 1) for r, c in enumerate(compute)]
        try:
            report = V.verify(program, m=m, v=1)
        except V.ScheduleError as error:
            raise AssertionError(f"p={p} m={m}: the verifier says: {_words(error)}") from None
        want = [min(p - r, m) for r in range(p)]
        wrong = [r for r in range(p) if report.peak_in_flight[r] != want[r]]
        assert not wrong, _ex07_slip(ex07(exercise_impl).one_f_one_b, p, m, wrong[0]) + (
            f"p={p} m={m}, rank {wrong[0]}: holds at most {report.peak_in_flight[wrong[0]]} "
            f"micro-batches' activations, expected min(p - r, m) = {want[wrong[0]]} (every rank: "
            f"measured {report.peak_in_flight}, expected {want})"
        )
        bubble = (p - 1) / (m + p - 1)
        slipped = [r for r in range(p) if _ex07_slip(ex07(exercise_impl).one_f_one_b, p, m, r)]
        assert report.bubble_fraction == pytest.approx(bubble), (
            _ex07_slip(ex07(exercise_impl).one_f_one_b, p, m, slipped[0]) if slipped else ""
        ) + (
            f"p={p} m={m}: bubble {report.bubble_fraction:.4f} of the time, expected (p-1)/(m+p-1) "
            f"= {bubble:.4f}"
        )


# -- ex09: context parallelism (one process) ---------------------------------------------------


def ex09(name: str, impl: str):
    return sandbox.exercise(name, impl)


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


def merge_close(got, want, what: str) -> None:
    """got == want (torch's tolerances), or an AssertionError naming `what` and the first
    element off, as [batch, head, query(, feature)]."""
    import torch

    off = ~torch.isclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
    if bool(off.any()):
        at = [int(i) for i in off.nonzero()[0]]
        raise AssertionError(
            f"{what}, element {at}: yours {got[tuple(at)].item():.6g}, the reference "
            f"{want[tuple(at)].item():.6g} ({int(off.sum())} of {off.numel()} elements off)"
        )


@pytest.mark.parametrize("cuts", [[1], [8], [15], [3, 7, 12]])
def test_ex09_online_softmax_merge_is_attention_over_all_keys(exercise_impl, cuts):
    """Block i holds keys edges[i]:edges[i + 1]; blocks merge left to right, each checked
    against attention over all the keys merged so far."""
    import torch
    from torch.nn import functional as F

    merge = ex09("ex09_online_softmax_merge", exercise_impl).merge
    q, k, v, blocks = attention_blocks(cuts)
    edges = [0, *cuts, 16]
    out, lse = blocks[0]
    for i, block in enumerate(blocks[1:], 1):
        out, lse = merge(out, lse, *block)
        a, b = edges[i], edges[i + 1]
        what = f"merging block {i} (keys {a}:{b}) into blocks 0..{i - 1} (keys 0:{a})"
        want = F.scaled_dot_product_attention(q, k[:, :, :b], v[:, :, :b])
        merge_close(out, want, f"{what}: out")
        scores = q @ k[:, :, :b].transpose(-1, -2) / math.sqrt(8)
        merge_close(lse, torch.logsumexp(scores, -1), f"{what}: lse")


def test_ex09_online_softmax_merge_scores_in_the_hundreds(exercise_impl):
    """exp(lse) overflows float32 here: only a merge rescaled by the running maximum stays
    finite."""
    import torch
    from torch.nn import functional as F

    merge = ex09("ex09_online_softmax_merge", exercise_impl).merge
    q, k, v, blocks = attention_blocks([8], scale=8.0)
    assert blocks[0][1].max() > 100, "the test needs scores past exp's float32 range"
    out, lse = merge(*blocks[0], *blocks[1])
    what = "merging block 1 (keys 8:16) into block 0 (keys 0:8), scores in the hundreds"
    bad = int((~torch.isfinite(out)).sum() + (~torch.isfinite(lse)).sum())
    assert not bad, f"{what}: {bad} inf or NaN in out and lse (exp(lse) overflows: rescale by m)"
    merge_close(out, F.scaled_dot_product_attention(q, k, v), f"{what}: out")


def test_ex09_online_softmax_merge_empty_blocks(exercise_impl):
    """A block with every key masked (lse = -inf, out = 0) contributes nothing; two of them stay
    empty, with no NaN."""
    import torch

    merge = ex09("ex09_online_softmax_merge", exercise_impl).merge
    _, _, _, blocks = attention_blocks([8])
    out, lse = blocks[0]
    empty = (torch.zeros_like(out), torch.full_like(lse, float("-inf")))
    masked = "a masked block (every key masked: lse = -inf, out = 0)"
    for what, merged in (
        (f"block 0 (keys 0:8), then {masked}", merge(out, lse, *empty)),
        (f"{masked}, then block 0 (keys 0:8)", merge(*empty, out, lse)),
    ):
        merge_close(merged[0], out, f"merging {what}: out")
        merge_close(merged[1], lse, f"merging {what}: lse")
    both = merge(*empty, *empty)
    what = "merging two masked blocks (every key masked: lse = -inf, out = 0)"
    assert not torch.isnan(both[0]).any() and not torch.isnan(both[1]).any(), (
        f"{what}: NaN in {'out' if torch.isnan(both[0]).any() else 'lse'} (exp(-inf - -inf): "
        "set m to 0 where it is -inf)"
    )
    assert torch.equal(both[0], empty[0]) and torch.isneginf(both[1]).all(), (
        f"{what}: out should stay 0 and lse -inf"
    )


@pytest.mark.parametrize("cp", range(1, 9))
def test_ex09_load_balanced_split_chunks(exercise_impl, cp):
    """Every rank's chunks, as minipar's layout; every token once; the same causal work."""
    import torch

    from minipar.parallel.context import layout

    split = ex09("ex09_load_balanced_split", exercise_impl)
    seq = 4 * cp  # chunk c is tokens 2c, 2c + 1
    work = []
    for r in range(cp):
        held = tuple(split.chunks_of(r, cp))
        assert held == (r, 2 * cp - 1 - r), (
            f"cp={cp}, rank {r}: chunks_of says {held}, the reference ({r}, {2 * cp - 1 - r}) "
            f"(the sequence cut into 2cp = {2 * cp} chunks, numbered from 0: head r, tail 2cp-1-r)"
        )
        mine = split.split(torch.arange(seq), 0, r, cp)
        want = layout.positions(r, cp, seq, causal=True)
        assert mine.tolist() == want.tolist(), (
            f"cp={cp}, rank {r}, split of {seq} tokens: yours holds tokens {mine.tolist()}, the "
            f"reference {want.tolist()} (its chunks {r} then {2 * cp - 1 - r}, 2 tokens each)"
        )
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
            assert torch.equal(split.split(x, dim, r, 3), want), (
                f"cp=3, rank {r}, split along dim={dim} of a (2, 3, 24, 5) tensor: not the "
                "tokens of its chunks (head then tail) along that dimension"
            )
    with pytest.raises(ValueError, match="20") as error:
        split.split(torch.randn(20), 0, 0, 3)
    assert "6" in str(error.value), f"name 2cp = 6 in the message: {error.value}"


# -- ex10: the MoE dispatch (one process; tests/ranks/exercises_ex10.py plugs it into MoE) ------


def ex10(impl: str):
    return sandbox.exercise("ex10_moe_dispatch", impl)


def copy_words(copy: int, experts, kept) -> str:
    """'copy 4 (token 2, its choice 0: expert 0, dropped)': copy i is token i // k, choice i % k
    (k choices per token)."""
    k = experts.shape[1]
    t, j = divmod(int(copy), k)
    state = "" if bool(kept[t, j]) else ", dropped"
    return f"copy {copy} (token {t}, its choice {j}: expert {int(experts[t, j])}{state})"


def dispatch_where(mod, experts, kept, e: int, what: str) -> None:
    """The student's sort_by_expert against minipar's: the first position of `order` that
    differs, or the first expert whose token count does, in words."""
    from minipar.parallel.expert import dispatch

    order, counts = mod.sort_by_expert(experts, kept, e)
    want_order, want_counts = dispatch.sort_by_expert(experts, kept, e)
    got_c, want_c = [int(c) for c in counts], [int(c) for c in want_counts]
    for x in range(e):
        assert x < len(got_c) and got_c[x] == want_c[x], (
            f"{what}: expert {x} receives {got_c[x] if x < len(got_c) else 'no count'} tokens in "
            f"your counts, {want_c[x]} in the reference's (counts yours {got_c}, the reference "
            f"{want_c}; dropped copies count for no expert)"
        )
    got_o, want_o = [int(i) for i in order], [int(i) for i in want_order]
    for i, want in enumerate(want_o):
        assert i < len(got_o) and got_o[i] == want, (
            f"{what}: position {i} of order holds "
            f"{copy_words(got_o[i], experts, kept) if i < len(got_o) else 'nothing'}, the "
            f"reference {copy_words(want, experts, kept)} (copies sorted by expert, ties in copy "
            "order (stable), dropped copies last)"
        )


def test_ex10_moe_dispatch_by_hand(exercise_impl):
    import torch

    mod = ex10(exercise_impl)
    experts = torch.tensor([[2, 0], [1, 3], [0, 1], [3, 2]])
    kept = torch.ones(4, 2, dtype=torch.bool)
    dispatch_where(mod, experts, kept, 4, "4 tokens, top-2 of 4 experts, none dropped")
    for counts, p, want in (([2, 2, 2, 2], 2, [4, 4]), ([2, 1, 0, 3], 2, [3, 3]),
                            ([2, 1, 0, 3], 4, [2, 1, 0, 3])):  # fmt: skip
        got = mod.split_sizes(torch.tensor(counts), p)
        assert got == want, (
            f"split_sizes(counts {counts}, {p} ranks): yours {got}, the reference {want} (rank q "
            f"holds experts {len(counts) // p} q .. {len(counts) // p} (q + 1) - 1)"
        )
    order = torch.tensor([1, 4, 2, 5, 0, 7, 3, 6])
    inverse = mod.inverse_permutation(order).tolist()
    assert inverse == [4, 0, 2, 6, 1, 3, 7, 5], f"inverse_permutation({order.tolist()}): {inverse}"
    kept[2, 0] = kept[0, 1] = False  # t2's e0 and t0's e0 dropped: last, in copy order
    dispatch_where(mod, experts, kept, 4, "the same with token 2's and token 0's expert 0 dropped")


@pytest.mark.parametrize("t,k,e,p", [(12, 2, 4, 2), (30, 1, 8, 4), (7, 2, 6, 3), (0, 2, 4, 2)])
def test_ex10_moe_dispatch_random_routings(exercise_impl, t, k, e, p):
    """Exactly minipar's own dispatch, on random routings with drops."""
    import torch

    from minipar.parallel.expert import dispatch

    mod = ex10(exercise_impl)
    gen = torch.Generator().manual_seed(t * 100 + e)
    experts = torch.rand(t, e, generator=gen).topk(k, -1).indices  # k distinct experts each
    kept = torch.rand(t, k, generator=gen) < 0.8
    dispatch_where(mod, experts, kept, e, f"{t} tokens, top-{k} of {e} experts, some dropped")
    order, counts = mod.sort_by_expert(experts, kept, e)
    got, want = mod.split_sizes(counts, p), dispatch.split_sizes(counts, p)
    assert got == want, (
        f"split_sizes(counts {counts.tolist()}, {p} ranks): yours {got}, want {want}"
    )
    inverse = mod.inverse_permutation(order)
    assert torch.equal(order[inverse], torch.arange(t * k)), "order[inverse] is not 0, 1, ..."
    assert torch.equal(inverse[order], torch.arange(t * k)), "inverse[order] is not 0, 1, ..."


# -- ex11: one ring per NIC (one process; the rings run on a simulated cluster) -------------------


def ex11(impl: str):
    return sandbox.exercise("ex11_nccl_rings", impl)


@pytest.mark.parametrize("size,per_node,channels", [(8, 4, 1), (8, 4, 2), (16, 8, 8), (11, 4, 4)])
def test_ex11_nccl_rings_orders(exercise_impl, size, per_node, channels):
    from minipar.simulate import rings

    got = ex11(exercise_impl).ring_orders(size, per_node, channels)
    want = rings.ring_orders(size, per_node, channels)
    what = f"{size} ranks, {per_node} per node, {channels} ring(s)"
    assert len(got) == channels, f"{what}: {len(got)} rings"
    for c, (mine, theirs) in enumerate(zip(got, want)):
        assert sorted(mine) == list(range(size)), f"{what}: ring {c} does not hold every rank once"
        nic = mine[per_node - 1] if len(mine) >= per_node else None
        assert mine == theirs, (
            f"{what}, ring {c}: yours {mine}, the reference {theirs}; yours leaves node 0 through "
            f"GPU {nic}'s NIC, the reference through GPU {theirs[per_node - 1]}'s (ring c "
            "starts each node at its GPU c: its last GPU there, c - 1, owns the NIC it leaves by)"
        )
    leaving = [order[per_node - 1] for order in got]  # the GPU each ring leaves node 0 from
    assert len(set(leaving)) == channels, f"rings share a NIC on their way out: {leaving}"


def test_ex11_nccl_rings_bad_channels(exercise_impl):
    for channels in (0, 9):
        try:
            ex11(exercise_impl).ring_orders(16, 8, channels)
        except ValueError as error:
            assert str(channels) in str(error), f"channels={channels}: name it in {error}"
        else:
            raise AssertionError(
                f"ring_orders(16, 8, channels={channels}): no ValueError; 1 <= channels <= "
                "per_node (one NIC per ring)"
            )


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
    return sandbox.exercise("ex12_checkpoint_interval", impl)


def test_ex12_checkpoint_interval_mtbi_from_llama3(exercise_impl):
    # 419 interruptions in 54 days on 16,384 GPUs: every 54 x 24 / 419 = 3.093 hours
    mod, want = ex12(exercise_impl), 54 * 86400 / 419
    got = mod.mtbi_seconds(419, 54, 16384, 16384)
    assert got == pytest.approx(want, rel=1e-9), (
        f"mtbi_seconds(419 interruptions, 54 days, 16384 GPUs seen, 16384 GPUs): yours {got:.6g} s,"
        f" want 54 days x 86400 / 419 = {want:.6g} s"
    )
    small = mod.mtbi_seconds(419, 54, 16384, 1024)
    assert small == pytest.approx(16 * want), (
        f"mtbi_seconds(..., 1024 GPUs): yours {small:.6g} s, want 16 x {want:.6g} = "
        f"{16 * want:.6g} s (a job of 16x fewer GPUs fails 16x less often)"
    )


def _interval_words(mod, save: float, mtbi: float, best: float) -> str:
    """How the student's best_interval behaves against the least-waste one, not the formula:
    the waste at theirs above the least (R = 600 s), and how theirs grows when the save cost or
    the MTBI grows 4x beside how the best one grows (2x: as a square root)."""
    tau = mod.best_interval(save, mtbi)
    head = f"best_interval(save {save:g} s, mtbi {mtbi:g} s): yours {tau:.6g} s"
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
        return f"{head}, not a positive number of seconds"

    def lost(t):  # the docstring's waste, computed here: the student's own may be wrong too
        return save / t + (600.0 + t / 2) / mtbi

    side = "longer" if best > tau else "shorter"
    words = [
        f"{head} wastes {lost(tau):.3%} of the clock, {100 * (lost(tau) - lost(best)):.3g} "
        f"points above the least waste ({lost(best):.3%}, at a {side} interval)"
    ]
    shape = {4.0: " (linear in it)", 1.0: " (independent of it)", 2.0: " (its square root)"}
    ratios = []
    for what, grown in (("save cost", (4 * save, mtbi)), ("MTBI", (save, 4 * mtbi))):
        ratios.append(mod.best_interval(*grown) / tau)
        how = next((v for k, v in shape.items() if abs(ratios[-1] - k) < 1e-6), "")
        words.append(
            f"4x the {what}: yours grows {ratios[-1]:.3g}x{how}, the least-waste interval 2x "
            "(its square root)"
        )
    if all(abs(r - 2) < 1e-6 for r in ratios):
        words.append(
            f"the growth is right, the constant is not: yours is {tau / best:.3g}x the best"
        )
    return "\n".join(words)


@pytest.mark.parametrize("save,mtbi", [(10.0, 11130.0), (60.0, 3600.0), (300.0, 40000.0)])
def test_ex12_checkpoint_interval_is_the_minimum(exercise_impl, save, mtbi):
    mod = ex12(exercise_impl)
    want_waste = save / 1000.0 + (600.0 + 1000.0 / 2) / mtbi
    got_waste = mod.waste(1000.0, save, 600.0, mtbi)
    assert got_waste == pytest.approx(want_waste, rel=1e-9), (
        f"waste(interval 1000 s, save {save:g} s, restart 600 s, mtbi {mtbi:g} s): yours "
        f"{got_waste:.6g}, want save/tau + (R + tau/2)/M = {want_waste:.6g}"
    )
    tau, want = mod.best_interval(save, mtbi), math.sqrt(2 * save * mtbi)
    assert tau == pytest.approx(want, rel=1e-9), _interval_words(mod, save, mtbi, want)
    for other in (0.5 * tau, 0.9 * tau, 1.1 * tau, 2 * tau):  # the minimum, seen from both sides
        assert mod.waste(other, save, 600.0, mtbi) > mod.waste(tau, save, 600.0, mtbi)


def test_ex12_checkpoint_interval_goodput_is_lesson_12s(exercise_impl):
    from minipar.course.lessons import l12_failures_at_scale as l12

    mod, m = ex12(exercise_impl), l12.mtbi_hours(16384) * 3600
    for save in l12.SAVE_COSTS:
        want = l12.goodput(l12.young_daly(save, m), save, l12.RESTART_S, m)
        got = mod.goodput(save, l12.RESTART_S, m)
        assert got == pytest.approx(want, rel=1e-9), (
            f"goodput(save {save:g} s, restart {l12.RESTART_S:g} s, mtbi {m:.6g} s): yours "
            f"{got:.6g}, lesson 12's {want:.6g} (1 - waste at the best interval)"
        )
    got = mod.goodput(3000.0, 3000.0, 3600.0)
    assert got == 0.0, f"goodput(save 3000 s, restart 3000 s, mtbi 3600 s): yours {got}, want 0"


# -- every multi-rank case (tests/ranks/exercises.py), after the one-process tests: an exercise's
# own function checked alone fails first, and says most

NODES_ENV = "MINIPAR_GRADE_NODES"  # the ranks on this many emulated nodes (launcher/cluster/)
FAILED: dict[str, tuple] = {}  # exercise -> (ranks, status, detail) of its first failure


@pytest.mark.parametrize("size,name", harness.params(SUITE, SIZES))
def test_ranks(size, name, exercise_impl):
    """One case on `size` ranks (one launch runs every case of a size). After an exercise's
    first failed case its later ones are skipped, here and on more ranks: the first failure is
    the one to read, and a grade of one exercise then launches no more jobs (`minipar grade`
    leaves such skips out)."""
    exercise = name.split("/")[0]
    if exercise in FAILED:  # its later cases did not run (tests/ranks/exercises.py)
        ranks, status, detail = FAILED[exercise]
        if status == "not started":
            pytest.skip(f"{grade.NOT_STARTED}{detail}")
        pytest.skip(f"{grade.NOT_RUN}{exercise} failed on {ranks} ranks already")
    nodes = int(os.environ.get(NODES_ENV) or 0) or None  # `minipar grade --nodes N`
    if nodes and (size < nodes or size % nodes):
        pytest.skip(f"{size} ranks do not fill {nodes} nodes evenly")
    os.environ[harness.SKIP_GROUPS_ENV] = ",".join(sorted(FAILED))  # their jobs: not again
    try:
        harness.run_suite(SUITE, size, "mpi", nodes=nodes).check(name)
    except Exception as error:
        FAILED.setdefault(exercise, (size, *grade.classify(error)))
        raise
