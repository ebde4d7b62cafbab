"""Expert parallelism (minipar.parallel.expert): MoE against its dense twin on real ranks at
ep = 1, 2, 4 on MPI and ep = 2 over the torch.distributed transport (tests/ranks/expert.py
has the cases and the tolerance), then the single-process pieces: DenseMoE against a loop over
tokens, the capacity queue, the dispatch by hand, the load statistics, a skewed router and the
auxiliary loss pulling it back, the group layout for ep < dp; and the router on its own (MoE
and DenseMoE share it): gates and auxiliary loss against numpy, its gradient against finite
differences.
"""

import math

import pytest
from conftest import ranks_suite

from minipar.testing import harness

SUITE = ranks_suite("expert.py")
OVER_TORCH = ranks_suite("expert_torch.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [1, 2, 4]))
def test_expert_parallel_mpi(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(OVER_TORCH, [2]))
def test_expert_parallel_torch_transport(size, name):
    harness.run_suite(OVER_TORCH, size, "torch").check(name)


# -- one process -------------------------------------------------------------------------------


def close(actual, expected, rtol=1e-5):
    scale = expected.abs().max().item() or 1.0
    err = (actual.detach() - expected.detach()).abs().max().item()
    assert err <= rtol * scale, f"max error {err:.3g} > {rtol} x {scale:.3g}"


@pytest.mark.parametrize("top_k,capacity_factor", [(1, None), (2, None), (2, 0.75), (1, 1.0)])
def test_dense_moe_is_the_loop_over_tokens(top_k, capacity_factor):
    """y_t = sum_j gate_tj * FFN_{e_tj}(x_t) over the kept copies, token by token; gradients too."""
    import torch
    from torch.nn import functional as F

    from minipar.parallel.expert import DenseMoE

    torch.manual_seed(0)
    moe = DenseMoE(6, 10, 4, top_k, capacity_factor)
    x = torch.randn(3, 5, 6, requires_grad=True)
    y = moe(x)
    x2 = x.detach().clone().requires_grad_()
    routing = moe.router(x2.reshape(-1, 6))
    ex, rows = moe.experts, []
    for t, token in enumerate(x2.reshape(-1, 6)):
        total = torch.zeros(6)
        for j in range(top_k):
            e = int(routing.experts[t, j])
            if routing.kept[t, j]:
                h = F.gelu(ex.w1[e] @ token + ex.b1[e])
                total = total + routing.weights[t, j] * (ex.w2[e] @ h + ex.b2[e])
        rows.append(total)
    want = torch.stack(rows).reshape(3, 5, 6)
    close(y, want)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    (want * dy).sum().backward()
    close(x.grad, x2.grad)
    if capacity_factor is not None:
        cap = math.ceil(capacity_factor * top_k * 15 / 4)
        assert moe.last_stats.capacity == (cap,)
        assert int(routing.kept.sum()) == 15 * top_k - moe.last_stats.dropped


def test_capacity_queue_first_choices_first():
    """C = ceil(cf * k * T / E); a token's second choice waits behind every first choice."""
    import torch

    from minipar.parallel.expert.router import capacity, keep_within_capacity

    assert capacity(None, 2, 100, 8) is None
    assert capacity(1.0, 2, 12, 4) == 6 and capacity(1.25, 1, 10, 4) == 4
    assert capacity(0.1, 1, 3, 4) == 1 and capacity(2.0, 2, 0, 4) == 0
    experts = torch.tensor([[0, 1], [0, 1], [1, 0], [0, 2]])  # T = 4, k = 2
    kept = keep_within_capacity(experts, 3, 2)
    # expert 0's queue: first choices t0, t1, t3, then t2's second; C = 2 keeps t0, t1
    # expert 1's queue: t2 (first), then t0, t1 (second): keeps t2 and t0
    want = torch.tensor([[True, True], [True, False], [True, False], [False, True]])
    assert torch.equal(kept, want), kept


def test_dispatch_by_hand():
    """The docstring's picture of dispatch.py: sort, split sizes, inverse, regroup."""
    import torch

    from minipar.parallel.expert import dispatch

    experts = torch.tensor([[2, 0], [1, 3], [0, 1], [3, 2]])
    kept = torch.tensor([[True, True], [True, True], [True, False], [True, True]])
    plan = dispatch.plan(experts, kept, 4, 2)
    assert plan.order.tolist() == [1, 4, 2, 0, 7, 3, 6, 5]  # e0: t0 t2 | e1: t1 | e2 | e3 | drop
    assert plan.counts.tolist() == [2, 1, 2, 2] and plan.splits == [3, 4]
    assert plan.tokens.tolist() == [0, 2, 1, 0, 3, 1, 3] and plan.kept == 7
    assert torch.equal(plan.order[plan.inverse], torch.arange(8))
    assert torch.equal(plan.inverse[plan.order], torch.arange(8))
    # received from 2 sources for 2 local experts: source 0 sent (1, 2) rows, source 1 (3, 0)
    perm, per_expert = dispatch.regroup(torch.tensor([[1, 2], [3, 0]]))
    assert perm.tolist() == [0, 3, 4, 5, 1, 2] and per_expert.tolist() == [4, 2]


def test_load_stats():
    from minipar.parallel.expert.stats import from_counts

    s = from_counts([6, 6], [[5, 3, 2, 2], [6, 2, 2, 2]], [[3, 3, 2, 2], [3, 2, 2, 2]], [3, 3], 2)
    assert s.tokens_per_expert == [11, 5, 4, 4] and s.kept_per_expert == [6, 5, 4, 4]
    assert s.tokens_per_rank(2) == [11, 8] and s.dropped == 5 and s.copies == 24
    assert s.imbalance == pytest.approx(11 / 6)
    assert s.summary(2) == (
        "experts [11, 5, 4, 4] (max/mean 1.83)   ranks [11, 8]   dropped 5 of 24 copies"
    )


def test_skewed_router_and_the_auxiliary_loss():
    """A router skewed toward expert 0: its imbalance is reported as the routing is, and a few
    SGD steps on the auxiliary loss alone bring it down (one process)."""
    import torch

    from minipar.parallel.expert import DenseMoE

    torch.manual_seed(0)
    moe = DenseMoE(16, 8, 4, top_k=1)
    x = torch.randn(256, 16) + 0.3  # tokens share a direction, (1, ..., 1)
    with torch.no_grad():
        moe.router.gate.weight[0] += 0.3  # and expert 0 listens to it
    opt = torch.optim.SGD(moe.router.parameters(), lr=0.3)
    seen = []
    for _ in range(8):
        moe(x)
        counts = torch.bincount(moe.router.gate(x).argmax(-1), minlength=4).tolist()
        assert moe.last_stats.tokens_per_expert == counts  # reported as routed
        seen.append((moe.last_stats.imbalance, moe.aux_loss.item()))
        opt.zero_grad()
        moe.aux_loss.backward()
        opt.step()
    (imb0, aux0), (imb1, aux1) = seen[0], seen[-1]
    assert imb0 > 2.5, f"the skewed router is not skewed: imbalance {imb0:.2f}"
    assert aux1 < aux0 and imb1 < 1.5, seen  # toward balance (1.0); measured 2.94 -> 1.19


def test_group_layout():
    from minipar.parallel.expert import (
        expert_data_parallel_ranks,
        expert_parallel_ranks,
        ranks_sharing_expert,
    )

    assert expert_parallel_ranks(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert expert_data_parallel_ranks(8, 2) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert expert_parallel_ranks(4, 4) == [[0, 1, 2, 3]]
    assert expert_data_parallel_ranks(4, 4) == [[0], [1], [2], [3]]
    assert ranks_sharing_expert(5, 8, 8, 4) == [2, 6]  # experts 4, 5 live at position 2
    with pytest.raises(ValueError, match="ep=3 must be a positive int that divides dp=8"):
        expert_parallel_ranks(8, 3)
    with pytest.raises(ValueError, match="expert 9 of n_experts=8"):
        ranks_sharing_expert(9, 8, 8, 2)


def test_bench_moe_summary():
    """`minipar bench moe`'s table from per-iteration times (the job itself is not a test)."""
    from minipar.bench import moe

    times = {
        "moe/ep": [0.3, 0.1, 0.2],
        "moe/local": [0.4, 0.4, 0.5],
        "comm/ep": [0.05, 0.05],
    }
    ep, local = moe.summary(times)
    assert (ep["layout"], local["layout"]) == ("ep", "local")
    assert (ep["min_ms"], ep["median_ms"], ep["max_ms"]) == pytest.approx((100, 200, 300))
    assert ep["comm_share"] == pytest.approx(0.25) and ep["x_local"] == pytest.approx(0.5)
    assert local["comm_share"] == 0 and local["x_local"] == pytest.approx(1.0)


# -- the router on its own: MoE and DenseMoE share it, so their comparison cannot see its rule --


def hand_routing(x, w, top_k):
    """The docstring's rule in numpy, from the numbers: softmax of x w^T per token, its top_k
    largest (descending), the gates p (top-1) or p / sum(p) (top-k > 1)."""
    import numpy as np

    logits = x @ w.T
    e = np.exp(logits - logits.max(1, keepdims=True))
    probs = e / e.sum(1, keepdims=True)
    chosen = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    p = np.take_along_axis(probs, chosen, 1)
    return chosen, (p if top_k == 1 else p / p.sum(1, keepdims=True)), probs


def test_router_gates_by_hand():
    """One token whose logits are log 1..4: probabilities 0.1, 0.2, 0.3, 0.4, so top-1 picks
    expert 3 at gate 0.4 (Switch keeps the raw probability) and top-2 picks 3, 2 at 4/7, 3/7."""
    import math

    import torch

    from minipar.parallel.expert.router import Router

    for top_k, experts, gates in ((1, [3], [0.4]), (2, [3, 2], [4 / 7, 3 / 7])):
        router = Router(1, 4, top_k).double()
        with torch.no_grad():
            logs = [[math.log(n)] for n in (1, 2, 3, 4)]
            router.gate.weight.copy_(torch.tensor(logs, dtype=torch.float64))
        r = router(torch.ones(1, 1, dtype=torch.float64))
        assert r.experts.tolist() == [experts], (top_k, r.experts)
        assert r.weights.detach()[0].tolist() == pytest.approx(gates, abs=1e-12), r.weights


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_router_against_numpy(top_k):
    """Experts, gates and the auxiliary loss (E * sum_e f_e P_e per group, then the mean over
    groups) for 9 tokens in groups of 4 and 5, against hand_routing and the formula in numpy."""
    import numpy as np
    import torch

    from minipar.parallel.expert.router import Router

    torch.manual_seed(top_k)
    E, H = 5, 6
    router = Router(H, E, top_k).double()
    x = torch.randn(9, H, dtype=torch.float64)
    r = router(x, [4, 5])
    chosen, gates, probs = hand_routing(x.numpy(), router.gate.weight.detach().numpy(), top_k)
    assert np.array_equal(r.experts.numpy(), chosen)
    assert np.abs(r.weights.detach().numpy() - gates).max() < 1e-12
    aux = []
    for rows in (slice(0, 4), slice(4, 9)):
        f = np.bincount(chosen[rows].ravel(), minlength=E) / chosen[rows].size
        aux.append(E * (f * probs[rows].mean(0)).sum())
    assert abs(r.aux_loss.item() - np.mean(aux)) < 1e-12, (r.aux_loss.item(), aux)
    assert r.routed.tolist() == [np.bincount(chosen[g].ravel(), minlength=E).tolist()
                                 for g in (slice(0, 4), slice(4, 9))]  # fmt: skip


def finite_difference(f, param, eps=1e-6):
    """d f / d param by central differences, entry by entry (float64)."""
    import torch

    grad = torch.zeros_like(param)
    with torch.no_grad():
        for i in range(param.numel()):
            was = param.view(-1)[i].item()
            param.view(-1)[i] = was + eps
            up = f().item()
            param.view(-1)[i] = was - eps
            down = f().item()
            param.view(-1)[i] = was
            grad.view(-1)[i] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize("top_k", [1, 2])
def test_router_gradient_against_finite_differences(top_k):
    """The gate weight's gradient, through the gates alone (a random weighting of them), through
    the auxiliary loss, and through DenseMoE's output: autograd against central differences in
    float64 (eps 1e-6, error about eps^2 ~ 1e-12, here asked within 1e-7), and not zero: the
    router learns from the output, top-1 included (Switch)."""
    import torch

    from minipar.parallel.expert import DenseMoE

    torch.manual_seed(10 + top_k)
    moe = DenseMoE(6, 8, 4, top_k).double()
    w = moe.router.gate.weight
    x = torch.randn(7, 6, dtype=torch.float64)
    c = torch.randn(7, top_k, dtype=torch.float64)
    dy = torch.randn(7, 6, dtype=torch.float64)
    losses = {
        "gates": lambda: (moe.router(x).weights * c).sum(),
        "aux": lambda: moe.router(x, [3, 4]).aux_loss,
        "moe output": lambda: (moe(x) * dy).sum(),
    }
    for what, f in losses.items():
        (got,) = torch.autograd.grad(f(), [w])
        want = finite_difference(f, w)
        assert want.abs().max() > 1e-3, f"{what}: the router gets no gradient"
        err = (got - want).abs().max().item()
        assert err < 1e-7 * want.abs().max().item(), f"{what}: gradient off by {err:.3g}"
