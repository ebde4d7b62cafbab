"""Context parallelism (minipar.parallel.context) on real ranks, against dense attention.

Every rank builds the same full q, k, v and upstream gradient (same seed) and runs torch's
scaled_dot_product_attention on the whole sequence; each rank then cuts its shard with
shard_sequence and runs ring_attention or ulysses_attention. Its output and the gradients of its
q, k and v shards must equal its shard of the dense ones, causal and not. Also: the work per
rank (block products counted by ContextStats) with the load-balanced layout and with the naive
contiguous causal split; the trace ledger's bytes against the formulas in ring.py and
ulysses.py; autograd's saved tensors per rank against dense attention's; the next block's
receive posted before this block's compute; two groups side by side; bad input raising the same
ValueError on every rank before any K/V byte moves; shard/unshard round trips; and torch's own
ring attention (the private kernel under torch.distributed.tensor.experimental.context_parallel,
which itself does not run on CPU: see test_context.py) on the same shards.

Tolerance: float32, within 1e-5 of the expected tensor's largest magnitude. The ring adds the
same exp(s - lse) v terms as the dense kernel but in cp blocks, each rescaled by
exp(lse_block - lse) when merged; each float32 exp, log, product and sum rounds at 2^-24, and a
sum of k terms may differ by about k * 2^-24 of their magnitude: with the S = 24 keys here the
differences stay under 2e-6 (measured about 5e-7). Ulysses runs the dense kernel itself on the
gathered heads, so it matches to the last bit in practice; the tolerance is the same.
The large-score cases (q and k times 8: scores up to about 335, where exp(score) overflows
float32 and only a merge that subtracts the running maximum survives) allow 5e-5: a score of
335 carries an absolute rounding of 335 x 2^-24 = 2e-5, which the two kernels (scaling before or
after the product) round differently and exp turns into relative differences of that size
(measured up to 6e-6). bfloat16 inputs: within 3e-2, a few bfloat16 roundings (2^-8 each).
"""

import functools

import torch
from torch.nn import functional as F

import minipar
from minipar.parallel.activation_memory import saved_bytes
from minipar.parallel.context import (
    ContextStats,
    ring,
    ring_attention,
    shard_sequence,
    ulysses_attention,
    unshard_sequence,
)
from minipar.parallel.context import layout as L

RTOL = 1e-5
LARGE_RTOL = 5e-5  # scores up to about 335 (see the docstring)
B, H, S, D = 2, 4, 24, 8  # S divides by 2cp for cp = 1, 2, 3, 4 (2, 4, 6, 8); H by cp = 1, 2, 4
VARIANTS = {"ring": ring_attention, "ulysses": ulysses_attention}


def close(actual, expected, what, rtol=RTOL):
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert torch.isfinite(actual).all(), f"{what}: not finite"
    scale = expected.abs().max().item() or 1.0
    err = (actual.detach().double() - expected.detach().double()).abs().max().item()
    assert err <= rtol * scale, f"{what}: max error {err:.3g} > {rtol} x {scale:.3g}"


def me(group=None):
    return minipar.get_rank(group), minipar.get_world_size(group)


def full_inputs(seed=0, scale=1.0, dtype=torch.float32):
    """The same full q, k, v (batch, heads, seq, head_dim) and upstream gradient on every rank."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, dy = (torch.randn(B, H, S, D, generator=g) for _ in range(4))
    return (scale * q).to(dtype), (scale * k).to(dtype), v.to(dtype), dy.to(dtype)


def dense(q, k, v, dy, causal):
    """torch's attention on the full sequence: (out, dq, dk, dv)."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    (out * dy).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def parallel(fn, q, k, v, dy, causal, group=None, stats=None, **kw):
    """This rank's (out, dq, dk, dv) from shards cut as the variant expects."""
    layout_causal = causal and kw.get("balanced", True)
    cut = functools.partial(shard_sequence, dim=2, group=group, causal=layout_causal)
    qs, ks, vs = (cut(t).requires_grad_() for t in (q, k, v))
    out = fn(qs, ks, vs, group=group, causal=causal, stats=stats, **kw)
    (out * cut(dy)).sum().backward()
    return out.detach(), qs.grad, ks.grad, vs.grad


def against_dense(variant, causal, balanced=True, scale=1.0, rtol=RTOL):
    """Output and gradients against the dense ones (scale: of q and k, so of the scores)."""

    def case():
        q, k, v, dy = full_inputs(1, scale)
        want = dense(q, k, v, dy, causal)
        got = parallel(VARIANTS[variant], q, k, v, dy, causal, balanced=balanced)
        cut = functools.partial(shard_sequence, dim=2, causal=causal and balanced)
        for name, g, w in zip(("output", "dq", "dk", "dv"), got, want):
            close(g, cut(w), f"{variant} causal={causal} balanced={balanced}: {name}", rtol)
        full = unshard_sequence(got[0], 2, causal=causal and balanced)
        close(full, want[0], "the unsharded output")

    return case


def bfloat16_case(variant):
    """bfloat16 in, bfloat16 out; within bfloat16 rounding (2^-8) of the float32 dense result."""

    def case():
        q, k, v, dy = full_inputs(2)
        want = dense(q, k, v, dy, True)
        got = parallel(VARIANTS[variant], *full_inputs(2, dtype=torch.bfloat16), True)
        assert all(t.dtype == torch.bfloat16 for t in got), [t.dtype for t in got]
        for name, g, w in zip(("output", "dq", "dk", "dv"), got, want):
            close(g.float(), shard_sequence(w, 2, causal=True), f"bf16 {name}", rtol=3e-2)

    return case


# -- work per rank -----------------------------------------------------------------------------
def block_counts(causal, balanced):
    """Block products and scores per rank, from ContextStats, against the formulas in ring.py;
    every rank the same with the load-balanced layout, rank r doing r + 1 with the naive split."""

    def case():
        r, cp = me()
        q, k, v, dy = full_inputs(3)
        stats = ContextStats()
        parallel(ring_attention, q, k, v, dy, causal, stats=stats, balanced=balanced)
        n, c = S // cp, S // (2 * cp)
        if not causal:
            want = (cp, cp * B * H * n * n)
        elif balanced and cp > 1:  # step 0: 2c x 2c; then c x 2c or 2c x c
            want = (cp, B * H * (4 * c * c + 2 * (cp - 1) * c * c))
        else:  # naive: the blocks of ranks 0..r
            want = (r + 1, (r + 1) * B * H * n * n)
        got = (stats.forward_blocks, stats.forward_scores)
        assert got == want, f"rank {r}: (blocks, scores) {got}, want {want}"
        assert (stats.backward_blocks, stats.backward_scores) == want, stats
        seen = [None] * cp
        minipar.all_gather_object(seen, got)
        if not causal or balanced:
            assert len(set(seen)) == 1, f"unequal work per rank: {seen}"
        elif cp > 1:
            assert seen[-1][1] == cp * seen[0][1], f"naive split: rank cp-1 vs rank 0 {seen}"
            assert len(set(seen)) == cp, f"naive split: every rank different, got {seen}"

    return case


def layout_work():
    """The causal (query, key) pairs each rank's tokens need (token i: i + 1 keys): the same on
    every rank with the load-balanced layout, growing with r for contiguous blocks."""
    _, cp = me()
    for causal in (True, False):
        needs = [int((L.positions(r, cp, S, causal) + 1).sum()) for r in range(cp)]
        if causal:
            assert len(set(needs)) == 1, f"load-balanced layout: unequal causal work {needs}"
        elif cp > 1:
            assert needs == sorted(needs) and needs[0] < needs[-1], needs


# -- bytes -------------------------------------------------------------------------------------
def p2p(t, kind="send"):
    return [m for m in t.messages if m.collective == "p2p" and m.kind == kind]


def agreement_only(t, what):
    """Apart from p2p and all-to-all, only the small all_gather_object of the arguments."""
    other = [m for m in t.messages if m.collective not in ("p2p", "all_to_all")]
    assert sum(m.nbytes for m in other if m.kind == "send") < 4096, (what, len(other))


def ring_ledger(causal, dtype=torch.float32):
    """Forward: cp-1 K/V blocks of 2N bytes each (N = one shard of k), each to the right
    neighbour. Backward: cp-1 K/V blocks again plus cp-1 dK/dV blocks (float32 accumulators:
    2N x 4/itemsize bytes each)."""

    def case():
        r, cp = me()
        q, k, v, dy = full_inputs(4, dtype=dtype)
        qs, ks, vs = (shard_sequence(t, 2, causal=causal).requires_grad_() for t in (q, k, v))
        with minipar.trace() as fwd:
            out = ring_attention(qs, ks, vs, causal=causal)
        with minipar.trace() as bwd:
            (out * shard_sequence(dy, 2, causal=causal)).sum().backward()
        kv = ks.nbytes + vs.nbytes
        dkv = kv * 4 // ks.element_size()
        sent = [m.nbytes for m in p2p(fwd)]
        assert sent == [kv] * (cp - 1), f"forward sent {sent}, want {cp - 1} x {kv}"
        assert {m.peer for m in p2p(fwd)} <= {(r + 1) % cp}, "K/V go to the right neighbour"
        assert {m.peer for m in p2p(fwd, "recv")} <= {(r - 1) % cp}, "and come from the left"
        assert fwd.bytes_sent("p2p") == (cp - 1) * kv
        assert sorted(m.nbytes for m in p2p(bwd)) == sorted([kv] * (cp - 1) + [dkv] * (cp - 1))
        assert bwd.bytes_sent("p2p") == (cp - 1) * (kv + dkv), bwd.bytes_sent("p2p")
        if dtype == torch.float32:
            assert bwd.bytes_sent() == 2 * fwd.bytes_sent("p2p"), "backward: twice the forward"
        agreement_only(fwd, "forward")
        assert not [m for m in bwd.messages if m.collective != "p2p"], "backward: p2p only"

    return case


def ulysses_ledger(causal):
    """Forward: 4 all-to-alls (q, k, v in, out back) of one shard's N bytes, each sending
    (cp-1)/cp N; backward: 4 more (dout in, dq, dk, dv back); no point-to-point."""

    def case():
        _, cp = me()
        q, k, v, dy = full_inputs(5)
        qs, ks, vs = (shard_sequence(t, 2, causal=causal).requires_grad_() for t in (q, k, v))
        with minipar.trace() as fwd:
            out = ulysses_attention(qs, ks, vs, causal=causal)
        with minipar.trace() as bwd:
            (out * shard_sequence(dy, 2, causal=causal)).sum().backward()
        n = qs.nbytes
        for t, what in ((fwd, "forward"), (bwd, "backward")):
            calls = [c for c in t.calls if c.collective == "all_to_all"]
            assert len(calls) == (4 if cp > 1 else 0), f"{what}: {t.algorithms}"
            sent = [c.bytes_sent for c in calls]
            assert sent == [(cp - 1) * n // cp] * len(calls), f"{what}: {sent}, N = {n}"
            assert not p2p(t), f"{what}: Ulysses sends no point-to-point"
        agreement_only(fwd, "forward")
        assert all(c.collective == "all_to_all" for c in bwd.calls), bwd.algorithms

    return case


# -- memory ------------------------------------------------------------------------------------
def memory_case(variant, causal):
    """Saved activations per rank = dense attention's on the full sequence / cp: q, k, v, out
    (batch, heads, S/cp, head_dim) and lse (batch, heads, S/cp). Ulysses' causal reordering
    also keeps two int64 index vectors of S."""

    def case():
        _, cp = me()
        q, k, v, _ = full_inputs(6)
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        dense_bytes = saved_bytes(lambda: F.scaled_dot_product_attention(*full, is_causal=causal))
        assert dense_bytes == 4 * (4 * B * H * S * D + B * H * S), dense_bytes
        shards = [shard_sequence(t, 2, causal=causal).requires_grad_() for t in (q, k, v)]
        mine = saved_bytes(lambda: VARIANTS[variant](*shards, causal=causal))
        extra = 2 * 8 * S if variant == "ulysses" and causal and cp > 1 else 0
        assert mine == dense_bytes // cp + extra, f"{mine} bytes saved, dense {dense_bytes}/{cp}"

    return case


# -- overlap: the next block is on its way while this one is computed --------------------------
def posted_before_compute():
    """When the block of ring step s is computed (s < cp-1), the receive of step s+1's block is
    already in the ledger (posted), and its arrival has not been waited for."""
    r, cp = me()
    q, k, v, _ = full_inputs(7)
    shards = [shard_sequence(t, 2) for t in (q, k, v)]
    seen, kernel = [], ring.online_softmax.block_attention

    def spy(*args, **kwargs):
        seen.append(len(p2p(t, "recv")))
        return kernel(*args, **kwargs)

    ring.online_softmax.block_attention = spy
    try:
        with minipar.trace() as t:
            ring_attention(*shards)
    finally:
        ring.online_softmax.block_attention = kernel
    want = [min(s + 1, cp - 1) for s in range(cp)]
    assert seen == want, f"receives posted at each block's compute {seen}, want {want}"


# -- groups ------------------------------------------------------------------------------------
def subgroups(variant):
    """Two context-parallel groups side by side ({0, 1} and {2, 3}), different data: each
    matches its own dense result and sends only on its own group."""

    def case():
        w = minipar.init()
        groups = [minipar.new_group([0, 1]), minipar.new_group([2, 3])]
        group = groups[w.rank // 2]
        q, k, v, dy = full_inputs(10 + w.rank // 2)
        want = dense(q, k, v, dy, True)
        with minipar.trace() as t:
            got = parallel(VARIANTS[variant], q, k, v, dy, True, group=group)
        for name, g, wt in zip(("output", "dq", "dk", "dv"), got, want):
            close(g, shard_sequence(wt, 2, group=group, causal=True), f"{variant} {name}")
        assert {m.group for m in t.messages} == {group.name}, {m.group for m in t.messages}

    return case


# -- bad input ---------------------------------------------------------------------------------
def expect_error(make, words, what):
    try:
        make()
    except ValueError as e:
        for w in words:
            assert w in str(e), f"{what}: {w!r} not in {str(e)!r}"
    else:
        raise AssertionError(f"{what}: no ValueError")


def no_data_moved(t, what):
    assert not p2p(t) and not p2p(t, "recv"), f"{what}: K/V moved before the error"
    assert not [m for m in t.messages if m.collective == "all_to_all"], f"{what}: all-to-all"
    agreement_only(t, what)


def bad_inputs():
    """Every rank raises the same ValueError, naming the values, before any K/V byte moves."""
    r, cp = me()
    x = torch.randn(B, H, 6, D)
    odd, three_heads = torch.randn(B, H, 5, D), torch.randn(B, 3, 6, D)
    attempts = [
        (lambda f: f(x, x[:, :, :4], x), ["(2, 4, 6, 8)", "(2, 4, 4, 8)", "rank 0"], "q vs k"),
        (lambda f: f(x, x, x.double()), ["float32", "float64"], "dtypes"),
        (lambda f: f(x[0], x[0], x[0]), ["(4, 6, 8)", "batch, heads, local_seq"], "3-D"),
        (lambda f: f(x, x, [1.0]), ["v is a list"], "not a tensor"),
    ]
    if cp > 1:
        attempts += [
            (lambda f: f(odd, odd, odd, causal=True), [f"{cp} x 5", f"2cp = {2 * cp}"], "odd"),
            (  # one rank passes a longer shard: every rank says so
                lambda f: f(*[torch.randn(B, H, 6 + 2 * (r == 1), D)] * 3),
                ["rank 0: (2, 4, 6, 8)", "rank 1: (2, 4, 8, 8)", "different shapes"],
                "ranks disagree",
            ),
            (
                lambda f: f(*[x.double() if r == cp - 1 else x] * 3),
                ["float32", "float64", "different shapes or dtypes"],
                "dtypes disagree",
            ),
        ]
    for name, fn in VARIANTS.items():
        for make, words, what in attempts:
            with minipar.trace() as t:
                expect_error(functools.partial(make, fn), [f"{name}_attention", *words], what)
            no_data_moved(t, f"{name} {what}")
    if 3 % cp:
        with minipar.trace() as t:
            expect_error(
                lambda: ulysses_attention(three_heads, three_heads, three_heads),
                ["heads = 3", f"cp = {cp}"],
                "heads",
            )
        no_data_moved(t, "heads")


def bad_layouts():
    """shard_sequence refuses lengths that do not cut into cp (or 2cp) equal parts; unshard
    refuses shards that differ across ranks (on every rank, before the gather)."""
    r, cp = me()
    length = 2 * cp + 1 if cp > 1 else None
    with minipar.trace() as t:
        if length:
            for causal, chunks in ((False, cp), (True, 2 * cp)):
                expect_error(
                    functools.partial(shard_sequence, torch.randn(2, length), 1, causal=causal),
                    [f"length {length}", f"divisible by {chunks}", f"cp = {cp}"],
                    "shard",
                )
        expect_error(lambda: shard_sequence(torch.randn(4), 3), ["dim=3"], "dim")
    assert not t.messages, "shard_sequence moves nothing"
    if cp > 1:
        shard = torch.randn(2, 3 + (r == 0))
        expect_error(lambda: unshard_sequence(shard, 1), ["rank 0: (2, 4)", "(2, 3)"], "unshard")


# -- layout ------------------------------------------------------------------------------------
def round_trip():
    """unshard(shard(x)) == x bitwise for every dim and both layouts; the shards partition the
    tokens; rank r holds chunks r and 2cp-1-r when load-balanced."""
    r, cp = me()
    x = torch.randn(4 * cp, 6 * cp, 2, 8 * cp, generator=torch.Generator().manual_seed(9))
    for causal in (False, True):
        assert L.chunks_of(r, cp, causal) == ((r, 2 * cp - 1 - r) if causal and cp > 1 else (r,))
        for dim in (0, 1, -1):
            shard = shard_sequence(x, dim, causal=causal)
            assert shard.shape[dim] == x.shape[dim] // cp, (dim, shard.shape)
            back = unshard_sequence(shard, dim, causal=causal)
            assert torch.equal(back, x), f"round trip dim={dim} causal={causal}"
        order = L.gathered_order(cp, S, causal)
        assert sorted(order.tolist()) == list(range(S)), order
        mine = L.positions(r, cp, S, causal)
        assert torch.equal(shard_sequence(torch.arange(S), 0, causal=causal), mine)


# -- against torch's own ring attention --------------------------------------------------------
@functools.cache
def torch_group():
    import torch.distributed as dist

    if not dist.is_initialized():
        from mpi4py import MPI

        from minipar.comm.transport.torch import init_from_mpi

        init_from_mpi(MPI.COMM_WORLD)
    return dist.group.WORLD


def against_torch(causal):
    """torch's ring kernels (_templated_ring_attention and its backward, what context_parallel
    dispatches to on CUDA) run here with the CPU flash-attention ops, on the same shards: the
    same output and gradients; torch's head-tail load balancer holds the same tokens."""

    def case():
        import torch.distributed.tensor.experimental._context_parallel._attention as A
        from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
            _HeadTailLoadBalancer,
        )

        r, cp = me()
        group = torch_group()
        order = _HeadTailLoadBalancer(S, cp, "cpu")._generate_indices()[0]
        mine = order.view(cp, -1)[r] if causal else torch.arange(S).view(cp, -1)[r]
        assert torch.equal(mine, L.positions(r, cp, S, causal)), (mine, "torch's layout")
        q, k, v, dy = full_inputs(8)
        got = parallel(ring_attention, q, k, v, dy, causal)
        qs, ks, vs, dys = (shard_sequence(t, 2, causal=causal) for t in (q, k, v, dy))
        aten = torch.ops.aten
        saved = A._cp_options.enable_load_balance
        A._cp_options.enable_load_balance = causal
        try:
            forward = aten._scaled_dot_product_flash_attention_for_cpu.default
            backward = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
            out, lse = A._templated_ring_attention(group, 2, forward, qs, ks, vs, causal)
            grads = A._templated_ring_attention_backward(
                group, 2, backward, dys, "grad_out", qs, ks, vs, out, lse, causal, dropout_p=0.0
            )
        finally:
            A._cp_options.enable_load_balance = saved
        for name, g, w in zip(("output", "dq", "dk", "dv"), got, (out, *grads[:3])):
            close(g, w, f"vs torch's ring, causal={causal}: {name}")

    return case


def cases(size):
    table = {}
    for variant in VARIANTS if H % size == 0 else ["ring"]:
        for causal in (False, True):
            mask = "causal" if causal else "full"
            table[f"{variant}.{mask}"] = against_dense(variant, causal)
            table[f"{variant}.{mask}.memory"] = memory_case(variant, causal)
        table[f"{variant}.large_scores"] = against_dense(variant, True, scale=8.0, rtol=LARGE_RTOL)
        table[f"{variant}.bfloat16"] = bfloat16_case(variant)
    table["ring.naive_causal"] = against_dense("ring", True, balanced=False)
    if H % size == 0:
        table["ulysses.naive_causal"] = against_dense("ulysses", True, balanced=False)
    table["ring.blocks.full"] = block_counts(False, True)
    table["ring.blocks.balanced"] = block_counts(True, True)
    table["ring.blocks.naive"] = block_counts(True, False)
    table["ring.ledger.full"] = ring_ledger(False)
    table["ring.ledger.causal"] = ring_ledger(True)
    table["ring.ledger.bfloat16"] = ring_ledger(True, torch.bfloat16)
    table["ring.posted_before_compute"] = posted_before_compute
    if H % size == 0:
        table["ulysses.ledger.full"] = ulysses_ledger(False)
        table["ulysses.ledger.causal"] = ulysses_ledger(True)
    table["layout.work"] = layout_work
    table["layout.round_trip"] = round_trip
    table["bad_inputs"] = bad_inputs
    table["bad_layouts"] = bad_layouts
    if size == 4:
        table["ring.subgroups"] = subgroups("ring")
        table["ulysses.subgroups"] = subgroups("ulysses")
    if size > 1:
        table["vs_torch.full"] = against_torch(False)
        table["vs_torch.causal"] = against_torch(True)
    return table
