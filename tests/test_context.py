"""Context parallelism (minipar.parallel.context): ring and Ulysses attention against dense
attention on real ranks, cp = 1, 2, 4 on MPI and 2 over the torch.distributed transport (every
case but the comparison with torch's kernels, which runs beside MPI; see tests/ranks/context.py
for the cases and the tolerance), and the one-process kernels underneath
(the online-softmax merge, one block's backward, the layouts' arithmetic).

torch's own `torch.distributed.tensor.experimental.context_parallel` does not run on CPU (torch
2.13, gloo): inside it scaled_dot_product_attention dispatches to
aten._scaled_dot_product_flash_attention_for_cpu, which has no context-parallel handler ("does
not have a sharding strategy registered"; only the CUDA flash, efficient and cuDNN kernels
have one), the math backend fails on "mixed torch.Tensor and DTensor", and buffers that require
grad cannot be sharded in place ("cannot resize variables that require grad"). The rank suite
therefore compares against the ring kernels that context_parallel dispatches to
(_templated_ring_attention and its backward), given the CPU flash-attention ops.
"""

import math
import os

import pytest
import torch
from conftest import ranks_suite
from torch.nn import functional as F

from minipar.parallel.context import layout, online_softmax, ring
from minipar.testing import harness

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
SUITE = ranks_suite("context.py")
OVER_TORCH = ranks_suite("context_torch.py")
MPI_SIZES = [1, 2, 3, 4] if EXTENDED else [1, 2, 4]  # cp = 3: the ring only (4 heads)


@pytest.mark.parametrize("size,name", harness.params(SUITE, MPI_SIZES))
def test_context_mpi(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(OVER_TORCH, [2, 4] if EXTENDED else [2]))
def test_context_torch_transport(size, name):
    harness.run_suite(OVER_TORCH, size, "torch").check(name)


# -- one process: the kernels ------------------------------------------------------------------
def qkv(n_keys=12, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    k = scale * torch.randn(2, 3, n_keys, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, n_keys, 8, generator=g, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("cut", [1, 4, 11])
def test_merge_of_two_blocks_is_attention_over_both(cut):
    q, k, v = qkv()
    a = online_softmax.block_attention(q, k[:, :, :cut], v[:, :, :cut])
    b = online_softmax.block_attention(q, k[:, :, cut:], v[:, :, cut:])
    out, lse = online_softmax.merge(*a, *b)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(8)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))


def test_merge_survives_scores_that_overflow_exp():
    """Scores in the thousands: exp(lse) is inf even in float64 past ~709; the merge never
    forms it."""
    q, k, v = (t.float() for t in qkv(scale=30.0))
    assert (q @ k.transpose(-1, -2)).abs().max() > 1000
    a = online_softmax.block_attention(q, k[:, :, :6], v[:, :, :6])
    b = online_softmax.block_attention(q, k[:, :, 6:], v[:, :, 6:])
    out, lse = online_softmax.merge(*a, *b)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=1e-4, atol=1e-4)


def test_merge_with_an_empty_block():
    """A block whose keys were all masked (lse = -inf, out = 0) leaves the other unchanged; two
    empty blocks stay empty, with no NaN."""
    q, k, v = qkv()
    out, lse = online_softmax.block_attention(q, k, v)
    empty = (torch.zeros_like(out), torch.full_like(lse, float("-inf")))
    for merged in (online_softmax.merge(out, lse, *empty), online_softmax.merge(*empty, out, lse)):
        torch.testing.assert_close(merged[0], out)
        torch.testing.assert_close(merged[1], lse)
    both = online_softmax.merge(*empty, *empty)
    assert torch.equal(both[0], empty[0]) and torch.isneginf(both[1]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_one_block_backward_is_autograds(causal):
    """One block holding every key: its backward with the final lse is autograd's gradient."""
    q, k, v = (t.requires_grad_() for t in qkv(n_keys=5))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    _, lse = online_softmax.block_attention(q.detach(), k.detach(), v.detach(), causal)
    delta = (dout * out.detach()).sum(-1)
    got = online_softmax.block_attention_backward(dout, q, k, v, lse, delta, causal)
    for name, g, t in zip("qkv", got, (q, k, v)):
        torch.testing.assert_close(g, t.grad, msg=f"d{name}")


# -- one process: the layouts and the ring's plan ----------------------------------------------
def test_load_balanced_layout_is_the_docstrings_picture():
    assert layout.positions(0, 2, 8, causal=True).tolist() == [0, 1, 6, 7]
    assert layout.positions(1, 2, 8, causal=True).tolist() == [2, 3, 4, 5]
    assert layout.positions(1, 2, 8, causal=False).tolist() == [4, 5, 6, 7]
    assert layout.chunks_of(1, 4, causal=True) == (1, 6)
    assert layout.positions(0, 1, 7, causal=True).tolist() == list(range(7))  # cp = 1: any S
    with pytest.raises(ValueError, match="length 12, which is not divisible by 8"):
        layout.positions(0, 4, 12, causal=True)


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_ring_plan_work_per_rank(cp):
    """block_of, every rank and step: the plan covers exactly the causal (query, key) pairs of
    the rank's tokens, once each; load-balanced, that is 2cp + 1 chunk pairs of c x c on every
    rank (less the masked halves of its two diagonal ones) and no step skipped; the naive split
    skips the cp - 1 - r steps whose keys all come later."""
    c, n = 3, 6  # chunk and shard length
    for balanced in (True, False):
        for rank in range(cp):
            pos = layout.positions(rank, cp, cp * n, causal=balanced)
            pairs, skipped = set(), 0
            for step in range(cp):
                block = ring.block_of(step, rank, cp, n, True, balanced)
                if block is None:
                    skipped += 1
                    continue
                rows, cols, diagonal = block
                keys = layout.positions((rank - step) % cp, cp, cp * n, causal=balanced)
                for i in range(n)[rows]:
                    for j in range(n)[cols]:
                        if not diagonal or j <= i:
                            pairs.add((int(pos[i]), int(keys[j])))
            want = {(i, j) for i in pos.tolist() for j in range(cp * n) if j <= i}
            assert pairs == want, (balanced, rank)  # every causal pair once, nothing else
            if balanced:
                assert len(pairs) == (2 * cp + 1) * c * c - c * (c - 1), rank
                assert skipped == 0
            else:
                assert skipped == cp - 1 - rank


def test_bench_context_summary():
    """The bench's table from per-iteration times (the job itself is not a test)."""
    from minipar.bench import context

    result = {
        "times": {
            "dense": [0.3, 0.2, 0.4],
            "ring": [0.1, 0.3, 0.2],
            "ulysses": [0.1, 0.1, 0.1],
            "ring-comm": [0.04, 0.04],
            "ulysses-comm": [0.02, 0.02],
        },
        "waits": {"ring": 0.01, "ulysses": 0.03},
    }
    rows = {r["cell"]: r for r in context.summary(result)}
    ring = rows["ring"]
    assert (ring["min_ms"], ring["median_ms"], ring["max_ms"]) == pytest.approx((100, 200, 300))
    assert ring["x_dense"] == pytest.approx(2 / 3) and ring["hidden"] == pytest.approx(0.75)
    assert rows["ulysses"]["hidden"] == 0.0 and rows["ulysses"]["waited_ms"] == pytest.approx(30)
    assert "hidden" not in rows["dense"] and rows["dense"]["x_dense"] == 1.0
