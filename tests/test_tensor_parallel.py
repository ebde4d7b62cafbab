"""Tensor parallelism (minipar.parallel.tensor) on real ranks: every layer against its dense
twin at TP = 1, 2, 3, 4 on MPI, a spread of cases over the torch.distributed transport (2
ranks; 3 and 4 too with MINIPAR_EXTENDED=1), and torch.distributed.tensor.parallel on the same
weights (see tests/ranks/tensor_parallel.py for the cases and the tolerance). One process: the
dense twins themselves against torch (they share causal_attention with the parallel layers).
"""

import os

import pytest
from conftest import ranks_suite

from minipar.testing import harness

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
SUITE = ranks_suite("tensor_parallel.py")
OVER_TORCH = ranks_suite("tensor_parallel_torch.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [1, 2, 3, 4]))
def test_tensor_parallel_mpi(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(OVER_TORCH, [2, 3, 4] if EXTENDED else [2]))
def test_tensor_parallel_torch_transport(size, name):
    harness.run_suite(OVER_TORCH, size, "torch").check(name)


def test_bench_tp_summary():
    """`minipar bench tp`'s table from per-iteration times (the job itself is not a test)."""
    from minipar.bench import tp

    times = {
        "mlp/minipar": [0.3, 0.1, 0.2],
        "mlp/torch": [0.4, 0.2, 0.6],
        "attention/minipar": [0.2, 0.2, 0.2],
        "attention/torch": [0.1, 0.1, 0.1],
        "comm/minipar": [0.05, 0.05],
        "comm/torch": [0.02, 0.02],
    }
    rows = {(r["block"], r["implementation"]): r for r in tp.summary(times)}
    mlp = rows["mlp", "minipar"]
    assert (mlp["min_ms"], mlp["median_ms"], mlp["max_ms"]) == pytest.approx((100, 200, 300))
    assert mlp["x_torch"] == pytest.approx(0.5) and mlp["comm_share"] == pytest.approx(0.25)
    assert rows["attention", "minipar"]["x_torch"] == pytest.approx(2.0)
    assert rows["attention", "torch"]["comm_share"] == pytest.approx(0.2)


def test_dense_twins_against_torch():
    """The dense twins every parallel layer is compared with, checked on their own (they share
    causal_attention with the parallel attention, so that comparison cannot see it): the
    attention core against torch's scaled_dot_product_attention (is_causal), outputs and q, k,
    v gradients; DenseSelfAttention against its projections around it; DenseMLP against
    fc2(gelu(fc1(x))) written out. float64, within 1e-10."""
    import torch
    from torch.nn import functional as F

    from minipar.parallel.tensor import DenseMLP, DenseSelfAttention
    from minipar.parallel.tensor.dense import causal_attention

    def close(a, b, what):
        err = (a - b).abs().max().item()
        assert err < 1e-10 * (b.abs().max().item() or 1.0), f"{what}: off by {err:.3g}"

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    dy = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    ours = causal_attention(q, k, v)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    close(ours, theirs, "causal attention")
    for a, b, name in zip(torch.autograd.grad(ours, [q, k, v], dy),
                          torch.autograd.grad(theirs, [q, k, v], dy), "qkv"):  # fmt: skip
        close(a, b, f"d{name}")
    attn = DenseSelfAttention(12, 3).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    qs, ks, vs = (t.view(2, 5, 3, 4).transpose(1, 2) for t in attn.qkv(x).split(12, dim=-1))
    heads = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    close(attn(x), attn.proj(heads.transpose(1, 2).reshape(2, 5, 12)), "self-attention")
    mlp = DenseMLP(12, 20).double()
    by_hand = F.gelu(x @ mlp.fc1.weight.T + mlp.fc1.bias) @ mlp.fc2.weight.T + mlp.fc2.bias
    close(mlp(x), by_hand, "MLP")
