"""Expert parallelism on real ranks: MoE against its single-process twin DenseMoE.

Every rank builds the same DenseMoE and the same tokens of every rank (same seeds); MoE takes
this rank's experts with `from_dense` and runs on this rank's tokens only, the dense twin on
all of them (`groups=p`: capacity and the auxiliary loss per rank, as MoE has them). Both run
forward and backward with the same upstream gradient and the auxiliary loss added: the output,
the input's gradient and each local expert's weight gradients must match the dense ones (the
owner's expert gradient covers every rank's tokens with no reduction), the router's gradient
after a sum over the ranks, and the load statistics exactly. Also: the ledger's bytes against
the tokens routed off-rank, tokens that stay on their rank (no byte of them moves), the dropped
copies against the capacity formula, bad input (the same ValueError on every rank, before any
token moves), and ep < dp (4 ranks: two expert-parallel groups, expert gradients summed over
the ranks sharing an expert).

Tolerance: float32, within 1e-5 of the expected tensor's largest magnitude. Each expert sees
the same rows in the same order in both runs, so its products agree to rounding; the router's
and the input's gradients are sums in another grouping (per rank, then an all-reduce; the
dense twin in one product), each float32 sum of k terms within about k * 2^-24 of their
magnitude, under 1e-6 for the k <= 48 here. Routing itself must agree exactly (ties between
experts' probabilities are measure-zero for random inputs; a routing difference would show as
an O(1) error, not a rounding one).
"""

import math

import torch
import torch.nn.functional as F

import minipar
from minipar.parallel.expert import (
    DenseMoE,
    MoE,
    expert_data_parallel_ranks,
    expert_parallel_ranks,
    sync_expert_grads,
)

RTOL = 1e-5
H, FFN, E, B, S = 8, 16, 4, 2, 6  # E divides by 1, 2 and 4; B*S tokens per rank
AUX = 0.1  # the auxiliary loss's weight in the tests' loss


def close(actual, expected, what):
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if not expected.numel():
        return
    scale = expected.abs().max().item() or 1.0
    err = (actual.detach() - expected.detach()).abs().max().item()
    assert err <= RTOL * scale, f"{what}: max error {err:.3g} > {RTOL} x {scale:.3g}"


def me(group=None):
    return minipar.get_rank(group), minipar.get_world_size(group)


def every_ranks_tokens(p, sizes=None, seed=1234):
    """(all tokens (N, H), tokens per rank): rank q's are rows sum(sizes[:q]) ..."""
    sizes = sizes or [B * S] * p
    return torch.randn(sum(sizes), H, generator=torch.Generator().manual_seed(seed)), sizes


def mine(t, sizes, r):
    return t[sum(sizes[:r]) : sum(sizes[: r + 1])]


def run_twins(dense, moe, x, sizes, router_group=None):
    """Forward and backward through both; returns (upstream gradient, dense input gradient)
    after checking the output, the input gradient and the router gradient (summed over
    router_group: the ranks whose tokens the dense twin saw)."""
    r = minipar.get_rank()
    xd = x.clone().requires_grad_()
    yd = dense(xd, groups=sizes)
    dy = torch.randn(yd.shape, generator=torch.Generator().manual_seed(99))
    ((yd * dy).sum() + AUX * len(sizes) * dense.aux_loss).backward()
    xm = mine(x, sizes, r).clone().requires_grad_()
    ym = moe(xm)
    ((ym * mine(dy, sizes, r)).sum() + AUX * moe.aux_loss).backward()
    close(ym, mine(yd, sizes, r), "output")
    close(xm.grad, mine(xd.grad, sizes, r), "input gradient")
    router = moe.router.gate.weight.grad.clone()
    minipar.all_reduce(router, group=router_group)  # replicated: data parallelism would sum it
    close(router, dense.router.gate.weight.grad, "router gradient (summed over the ranks)")


def check_expert_grads(moe, dense):
    """Each of this rank's experts against the dense gradient of the same expert."""
    for name, q in moe.experts.named_parameters():
        want = getattr(dense.experts, name).grad[moe.first : moe.first + moe.n_local]
        close(q.grad, want, f"gradient of experts.{name} (experts {moe.first}..)")


def expected_dropped(dense, x, sizes, top_k, capacity_factor):
    """The capacity formula on the routing seen: sum over ranks and experts of
    max(0, routed - C), C = ceil(cf * k * T / E), from the router's own top-k."""
    with torch.no_grad():
        choice = F.softmax(dense.router.gate(x), -1).topk(top_k, -1).indices
    total = 0
    for group, t in zip(choice.split(sizes), sizes):
        cap = math.ceil(capacity_factor * top_k * t / E)
        counts = torch.bincount(group.reshape(-1), minlength=E)
        total += int((counts - cap).clamp(min=0).sum())
    return total


def twin_case(top_k, capacity_factor, uneven=False):
    def case():
        r, p = me()
        sizes = [5, 0, 7, 3][:p] if uneven and p > 1 else None
        x, sizes = every_ranks_tokens(p, sizes)
        torch.manual_seed(7)
        dense = DenseMoE(H, FFN, E, top_k, capacity_factor)
        moe = MoE.from_dense(dense)
        assert moe.experts.w1.shape == (E // p, FFN, H)
        run_twins(dense, moe, x, sizes)
        check_expert_grads(moe, dense)
        assert moe.last_stats == dense.last_stats, (moe.last_stats, dense.last_stats)
        if capacity_factor is None:
            assert moe.last_stats.dropped == 0
        else:
            want = expected_dropped(dense, x, sizes, top_k, capacity_factor)
            assert moe.last_stats.dropped == want, (moe.last_stats.dropped, want)

    return case


def dense_dtype_case():
    """MoE.from_dense keeps the dense model's dtype and device (float64 here; a GPU's in
    cuda_strategies): router and experts float64, and the float64 forward of this rank's
    tokens matches the dense one to float64 precision."""
    r, p = me()
    x, sizes = every_ranks_tokens(p)
    x = x.double()
    torch.manual_seed(7)
    dense = DenseMoE(H, FFN, E, top_k=2).double()
    moe = MoE.from_dense(dense)
    for name, q in moe.named_parameters():
        assert q.dtype == torch.float64, f"MoE.{name}: {q.dtype}, not float64"
    y, want = moe(mine(x, sizes, r)), mine(dense(x, groups=sizes), sizes, r)
    err = (y - want).abs().max().item()
    assert y.dtype == torch.float64 and err < 1e-12, (y.dtype, err)


# -- the ledger: bytes against the tokens routed off-rank -----------------------------------
def off_rank(dense, x, sizes, r, p):
    """(copies of rank r's tokens kept and routed to another rank's experts, copies of the other
    ranks' tokens kept and routed to r's): from the dense twin's routing."""
    with torch.no_grad():
        routing = dense.router(x, sizes)
    owner = routing.experts // (E // p)  # the rank of each copy's expert
    source = torch.repeat_interleave(torch.arange(p), torch.tensor(sizes)).unsqueeze(1)
    kept = routing.kept
    sent = int((kept & (source == r) & (owner != r)).sum())
    received = int((kept & (source != r) & (owner == r)).sum())
    return sent, received


def check_counts_call(calls, p):
    """The count exchange: one all-gather of p (3 + 2E) int64, bytes as minipar.cost says."""
    (gather,) = [c for c in calls if c.collective == "all_gather"]
    want = minipar.cost.traffic("all_gather", gather.algorithm, p * (3 + 2 * E) * 8, p)
    assert gather.bytes_sent == want.bytes_sent, (gather.algorithm, gather.bytes_sent, want)


def ledger_case(top_k, capacity_factor):
    """Forward: the count all-gather, then two all-to-alls, rank r sending (its copies routed
    off-rank + the copies it processed for the others) x H x 4 bytes; backward: the two
    all-to-alls reversed, the same bytes; no message to itself; nothing on one rank."""

    def case():
        r, p = me()
        x, sizes = every_ranks_tokens(p)
        torch.manual_seed(7)
        dense = DenseMoE(H, FFN, E, top_k, capacity_factor)
        moe = MoE.from_dense(dense)
        xm = mine(x, sizes, r).clone().requires_grad_()
        with minipar.trace() as fwd:
            y = moe(xm)
        with minipar.trace() as bwd:
            y.sum().backward()
        if p == 1:
            assert not fwd.messages and not bwd.messages, (fwd, bwd)
            return
        sent, received = off_rank(dense, x, sizes, r, p)
        row = H * 4  # one float32 token
        assert [c.collective for c in fwd.calls] == ["all_gather", "all_to_all", "all_to_all"]
        assert [c.collective for c in bwd.calls] == ["all_to_all", "all_to_all"]
        check_counts_call(fwd.calls, p)
        dispatch, combine = fwd.calls[1:]
        assert dispatch.bytes_sent == sent * row, (dispatch.bytes_sent, sent, row)
        assert combine.bytes_sent == received * row, (combine.bytes_sent, received, row)
        assert dispatch.bytes_received == received * row and combine.bytes_received == sent * row
        assert bwd.bytes_sent("all_to_all") == (sent + received) * row  # reversed, same bytes
        assert all(m.peer != m.rank for m in fwd.messages + bwd.messages), "a message to itself"
        every = [None] * p
        minipar.all_gather_object(every, (sent, received))
        assert sum(s for s, _ in every) == sum(q for _, q in every)  # each copy out and back

    return case


def local_case():
    """A router that sends every token to its own rank's experts (E = 2p, 2 per rank, top-2):
    the all-to-alls carry no byte of them, and the output is still the dense twin's."""
    r, p = me()
    e = 2 * p
    torch.manual_seed(3)
    dense = DenseMoE(H, FFN, e, top_k=2)
    with torch.no_grad():  # expert j listens to feature j mod H; rank q's tokens light up 2q, 2q+1
        dense.router.gate.weight.copy_(10 * torch.eye(H)[torch.arange(e) % H])
    noise = 0.1 * torch.randn(p, B * S, H, generator=torch.Generator().manual_seed(4))
    for q in range(p):
        noise[q, :, (2 * q) % H] += 3
        noise[q, :, (2 * q + 1) % H] += 3
    x, sizes = noise.reshape(-1, H), [B * S] * p
    moe = MoE.from_dense(dense)
    with minipar.trace() as t:
        run_twins(dense, moe, x, sizes)
    assert moe.last_stats.tokens_per_rank(p) == [2 * B * S] * p, moe.last_stats
    moved = [m for m in t.messages if m.collective == "all_to_all" and m.nbytes]
    assert not moved, f"{len(moved)} all-to-all messages carry bytes, e.g. {moved[0]}"


# -- bad input: the same ValueError on every rank, no token moved ---------------------------
def expect_error(make, words):
    with minipar.trace() as t:
        try:
            make()
        except ValueError as e:
            assert all(w in str(e) for w in words), f"{words} not in {e}"
        else:
            raise AssertionError(f"no ValueError for {words}")
    moved = t.bytes_sent("all_to_all") + t.bytes_sent("broadcast")
    assert not moved, f"{moved} bytes of tokens or weights moved before the error"


def bad_config():
    r, p = me()
    attempts = [
        (lambda: MoE(H, FFN, E, top_k=E + 1), [f"top_k={E + 1}", f"n_experts={E}"]),
        (lambda: MoE(H, FFN, E, top_k=0), ["top_k=0"]),
        (lambda: MoE(H, FFN, E, capacity_factor=0), ["capacity_factor=0", "None (dropless)"]),
        (lambda: MoE(H, FFN, E, capacity_factor="2"), ["capacity_factor='2'"]),
        (lambda: MoE(H, FFN, 0), ["n_experts=0"]),
        (lambda: DenseMoE(H, FFN, E, top_k=5), ["DenseMoE", "top_k=5"]),
    ]
    if p > 1:
        odd = p + 1  # divides by none of 2, 4
        attempts += [
            (lambda: MoE(H, FFN, odd), [f"n_experts={odd}", f"group size {p}"]),
            (lambda: MoE(H, FFN, E + (r == 1)), ["disagree on n_experts", f"rank 1 has {E + 1}"]),
            (lambda: MoE(H + r, FFN, E), ["disagree on hidden", f"rank {p - 1} has {H + p - 1}"]),
            (lambda: MoE(H, FFN, E, top_k=1 + (r == 0)), ["disagree on top_k", "rank 0 has 2"]),
            (  # a rank that would fail alone (top_k=5) still fails with the others, together
                lambda: MoE(H, FFN, E, top_k=5 if r == p - 1 else 2),
                ["disagree on top_k", f"rank {p - 1} has 5"],
            ),
        ]
    for make, words in attempts:
        expect_error(make, words)


def bad_forward():
    """One rank's input is wrong: every rank raises, naming it, and no token is sent."""
    r, p = me()
    moe = MoE.from_dense(DenseMoE(H, FFN, E))
    last = p - 1
    wide = torch.randn(B, S, H + (r == last))
    expect_error(lambda: moe(wide), [f"hidden={H}", f"rank {last} passed {H + 1}"])
    wrong = torch.randn(B, S, H, dtype=torch.float64 if r == last else torch.float32)
    expect_error(lambda: moe(wrong), ["float32", f"rank {last} passed float64"])
    assert moe(torch.randn(B, S, H)).shape == (B, S, H)  # and the layer still works after


# -- ep < dp: experts sharded over part of the data-parallel ranks --------------------------
def ep_below_dp():
    """4 ranks, ep = 2: tokens travel inside [0 1] and [2 3]; ranks [0 2] and [1 3] hold the same
    experts and sum their gradients. The result is the dense twin over all 4 ranks' tokens."""
    r, p = me()
    ep = 2
    assert expert_parallel_ranks(p, ep) == [[0, 1], [2, 3]]
    assert expert_data_parallel_ranks(p, ep) == [[0, 2], [1, 3]]
    ep_groups = [minipar.new_group(g) for g in expert_parallel_ranks(p, ep)]
    edp_groups = [minipar.new_group(g) for g in expert_data_parallel_ranks(p, ep)]
    ep_group, edp_group = ep_groups[r // ep], edp_groups[r % ep]
    x, sizes = every_ranks_tokens(p)
    torch.manual_seed(7)
    dense = DenseMoE(H, FFN, E, top_k=2, capacity_factor=1.25)
    moe = MoE.from_dense(dense, group=ep_group)
    assert moe.first == (r % ep) * (E // ep)
    with minipar.trace() as t:
        run_twins(dense, moe, x, sizes, router_group=None)
    assert {c.group for c in t.calls if c.collective == "all_to_all"} == {ep_group.name}
    sync_expert_grads(moe, group=edp_group)
    check_expert_grads(moe, dense)


def cases(size):
    table = {}
    for k in (1, 2):
        for cf, tag in ((None, "dropless"), (1.0, "capacity")):
            table[f"twin.k{k}.{tag}"] = twin_case(k, cf)
        table[f"ledger.k{k}.capacity"] = ledger_case(k, 1.0)
    table["twin.k2.uneven_tokens"] = twin_case(2, 1.25, uneven=True)
    table["ledger.k2.dropless"] = ledger_case(2, None)
    table["local_tokens_stay"] = local_case
    table["from_dense.float64"] = dense_dtype_case
    table["bad_config"] = bad_config
    table["bad_forward"] = bad_forward
    if size == 4:
        table["ep_below_dp"] = ep_below_dp
    return table
