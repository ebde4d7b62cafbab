"""Lesson 10: mixture of experts, expert parallelism (text: lessons/10_mixture_of_experts.md).

    minipar lesson 10 -n 2                    # minipar.course.lessons.l10_mixture_of_experts
    minipar lesson 10 --break no-counts       # the count exchange skipped: the transport refuses
    minipar lesson 10 --break wrong-group     # experts' gradients summed over the wrong ranks

One MoE layer (E = 4 experts, top-2, hidden 64, 256 tokens per rank) spread over the ranks: its
output and gradients against its dense twin, the bytes of its count exchange and its two
all-to-alls each way predicted and then read off the ledger against a ring all-reduce of the
same activations, the cost model on B200 nodes, a skewed router's imbalance and the auxiliary
loss pulling it back, the copies a capacity factor drops, and the groups of a dp x ep mesh.
"""

from __future__ import annotations

import torch

import minipar
from minipar import cost
from minipar.course.lessons import planted
from minipar.course.lessons.page import Page, fmt_time
from minipar.parallel import DeviceMesh
from minipar.parallel.expert import DenseMoE, MoE, capacity, dispatch, groups

E, TOP_K, H, FFN, T = 4, 2, 64, 128, 256  # the lesson's layer: T tokens per rank, float32
FLOAT = 4

# the cluster model: an MoE layer of a 2025-size model on B200s, bf16, evenly routed
BIG_H, BIG_FFN, BIG_T, BF16 = 4096, 16384, 8192, 2
B200_FLOPS = 2.25e15  # dense BF16 matmul, NVIDIA HGX B200 datasheet (per GPU)
CLUSTER = ((8, "nvlink5"), (8, "ib_ndr"), (64, "ib_ndr"))


# -- the formulas (claims(): what the text states) --------------------------------------------
def counts_bytes(p: int, n_experts: int = E) -> int:
    """The count all-gather on the ring: (p - 1) blocks of 3 + 2E int64 per rank."""
    return (p - 1) * (3 + 2 * n_experts) * 8


def all_to_all_bytes(p: int, tokens: int = T, hidden: int = H, size: int = FLOAT) -> float:
    """One all-to-all, evenly routed: top_k T (p - 1)/p copies of hidden values leave a rank."""
    return TOP_K * tokens * (p - 1) / p * hidden * size


def all_reduce_bytes(p: int, tokens: int = T, hidden: int = H, size: int = FLOAT) -> float:
    """A ring all-reduce of the (T, hidden) activations: 2 (p - 1)/p of them per rank."""
    return 2 * (p - 1) / p * tokens * hidden * size


def cluster_rows():
    """(ep, link, one all-to-all, 4 per layer, expert compute, comm / compute) for one MoE
    layer of h = 4096, ffn = 16384, top-2, 8192 tokens per GPU, bf16, evenly routed."""
    links = {"nvlink5": cost.NVLINK5, "ib_ndr": cost.IB_NDR}
    compute = 3 * 4 * TOP_K * BIG_T * BIG_H * BIG_FFN / B200_FLOPS  # fwd + bwd = 3 x forward
    rows = []
    for ep, name in CLUSTER:
        one = cost.predict("all_to_all", "pairwise", TOP_K * BIG_T * BIG_H * BF16, ep, links[name])
        rows.append((ep, links[name].name, one, 4 * one, compute, 4 * one / compute))
    return rows


def skewed_router_run(steps: int = 8):
    """A router skewed toward expert 0 (256 tokens, E = 4, top-1; one process), trained on the
    auxiliary loss alone with SGD: [(imbalance, aux loss)] before each step."""
    torch.manual_seed(0)
    moe = DenseMoE(16, 8, E, top_k=1)
    x = torch.randn(256, 16) + 0.3  # the tokens share a direction, (1, ..., 1)
    with torch.no_grad():
        moe.router.gate.weight[0] += 0.3  # and expert 0 listens to it
    opt = torch.optim.SGD(moe.router.parameters(), lr=0.3)
    seen = []
    for _ in range(steps):
        moe(x)
        seen.append((moe.last_stats.imbalance, moe.aux_loss.item()))
        opt.zero_grad()
        moe.aux_loss.backward()
        opt.step()
    return seen


def claims() -> list[str]:
    """Numbers lessons/10_mixture_of_experts.md states; tests/test_lessons.py checks the text."""
    out = [
        f"{counts_bytes(2)} bytes",
        f"{all_to_all_bytes(2):,.0f} bytes",
        f"{all_reduce_bytes(2):,.0f} bytes",
        f"{4 * all_to_all_bytes(2):,.0f} bytes",
        f"{float(E):.2f} for the lesson's E = {E}",
        f"= {capacity(1.0, TOP_K, T, E)} at capacity factor 1.0, {capacity(1.25, TOP_K, T, E)}",
        f"keeps C = {capacity(1.0, 1, T, E)} of them",
        f"{T - capacity(1.0, 1, T, E)} ({(T - capacity(1.0, 1, T, E)) / T:.0%})",
    ]
    for _, _, one, four, compute, ratio in cluster_rows():
        out += [fmt_time(one), fmt_time(four), fmt_time(compute), f"{ratio:.0%}"]
    seen = skewed_router_run()
    (imb0, aux0), (imb1, aux1) = seen[0], seen[-1]
    out += [f"imbalance {imb0:.2f}", f"to {imb1:.2f}", f"from {aux0:.2f} to {aux1:.2f}"]
    return out


# -- the live layer ---------------------------------------------------------------------------
def layer(group=None, seed: int = 0, capacity_factor=None, top_k: int = TOP_K):
    """(the expert-parallel layer over `group`, its dense twin): the same on every rank."""
    torch.manual_seed(seed)
    dense = DenseMoE(H, FFN, E, top_k, capacity_factor)
    return MoE.from_dense(dense, group), dense


def tokens_of(rank: int, tokens: int = T, shift: float = 0.0) -> torch.Tensor:
    return torch.randn(tokens, H, generator=torch.Generator().manual_seed(100 + rank)) + shift


def close(a, b) -> float:
    """Largest |a - b| relative to max |b|."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def twin_section(page: Page) -> None:
    p = page.size
    page.prediction(f"an MoE layer on {p} ranks equals its dense twin on every rank's tokens")
    page.say(
        f"E = {E} experts of hidden {H} -> {FFN} -> {H}, top-{TOP_K}, dropless; rank r holds "
        f"experts r*E/p .. (r+1)*E/p - 1 ({E // p} each here) and routes its own {T} tokens."
    )
    moe, dense = layer()
    x = tokens_of(page.rank).requires_grad_()
    moe(x).square().sum().backward()
    everyone = torch.cat([tokens_of(r) for r in range(p)]).requires_grad_()
    y = dense(everyone, groups=p)
    y.square().sum().backward()
    mine = slice(page.rank * T, (page.rank + 1) * T)
    first, n = moe.first, moe.n_local
    errors = {
        "output": close(moe(x.detach()), y[mine].detach()),
        "input gradient": close(x.grad, everyone.grad[mine]),
        "router gradient (summed over ranks)": _router_error(moe, dense),
        "this rank's experts' w1 gradient": close(
            moe.experts.w1.grad, dense.experts.w1.grad[first : first + n]
        ),
    }
    seen = page.gather(errors)
    page.measurement("the largest error on any rank, relative to the dense twin's")
    rows = [(what, f"{max(e[what] for e in seen):.1e}") for what in errors]
    page.table(None, ["tensor", "error>"], rows)
    page.check(all(max(e[w] for e in seen) < 1e-5 for w in errors), "MoE equals DenseMoE")


def _router_error(moe, dense) -> float:
    """The router is replicated: each rank's gradient covers its own tokens; their sum (what
    data parallelism would reduce) is the dense router's gradient."""
    total = moe.router.gate.weight.grad.clone()
    minipar.all_reduce(total)
    return close(total, dense.router.gate.weight.grad)


def bytes_section(page: Page) -> None:
    p = page.size
    page.prediction(f"the bytes one rank sends, p = {p}, T = {T} tokens, h = {H}, float32")
    page.table(
        None,
        ["what", "formula", "bytes>"],
        [
            ("count all-gather", "(p-1)(3 + 2E) x 8", counts_bytes(p)),
            ("one all-to-all, evenly routed", "k T (p-1)/p h s", f"{all_to_all_bytes(p):,.0f}"),
            ("the layer: 4 all-to-alls", "fwd + bwd", f"{4 * all_to_all_bytes(p):,.0f}"),
            ("ring all-reduce of (T, h)", "2 (p-1)/p T h s", f"{all_reduce_bytes(p):,.0f}"),
        ],
        caption="with k = 2 one all-to-all sends what a ring all-reduce of the activations does",
    )
    moe, _ = layer()
    x = tokens_of(page.rank).requires_grad_()
    with minipar.trace() as fwd:
        y = moe(x)
    with minipar.trace() as bwd:
        y.sum().backward()
    routing = moe.router(x.detach())
    plan = dispatch.plan(routing.experts, routing.kept, E, p)
    off_rank = plan.kept - plan.splits[page.rank]  # my copies that leave me
    received = sum(moe.last_stats.kept_per_expert[moe.first : moe.first + moe.n_local])
    came_in = received - plan.splits[page.rank]  # others' copies my experts worked on
    act = torch.zeros(T, H)
    with minipar.trace() as ar:
        minipar.all_reduce(act, algorithm="ring")
    a2a = [c for c in fwd.calls + bwd.calls if c.collective == "all_to_all"]
    counts = [c for c in fwd.calls if c.collective == "all_gather"]
    # forward: dispatch (my copies out), combine (others' outputs back); backward the reverse
    # exchanges, the later one first: the outputs' gradients out, then the inputs' back
    want = [off_rank, came_in, off_rank, came_in]
    mine = {
        "counts": sum(c.bytes_sent for c in counts),
        "a2a": [c.bytes_sent for c in a2a],
        "want": [n * H * FLOAT for n in want],
        "ar": ar.bytes_sent(),
    }
    seen = page.gather(mine)
    page.measurement("the layer's ledger on each rank (forward and backward)")
    rows = [
        (r, s["counts"], ", ".join(f"{b:,}" for b in s["a2a"]), f"{sum(s['a2a']):,}",
         f"{s['ar']:,}")
        for r, s in enumerate(seen)
    ]  # fmt: skip
    page.table(None, ["rank", "counts>", "each all-to-all", "layer>", "all-reduce>"], rows)
    page.check(
        all(s["counts"] == counts_bytes(p) for s in seen),
        "the count exchange sends (p-1)(3+2E) x 8 bytes",
    )
    page.check(
        all(s["a2a"] == s["want"] for s in seen),
        "each all-to-all sends the copies routed off-rank x h x 4 bytes, as routed",
    )
    page.check(all(s["ar"] == all_reduce_bytes(p) for s in seen), "the all-reduce: 2(p-1)/p")


def cluster_section(page: Page) -> None:
    page.prediction(
        f"one MoE layer of h = {BIG_H}, ffn = {BIG_FFN}, top-2, {BIG_T} tokens per GPU, bf16, "
        "on B200s"
    )
    page.table(
        None,
        ["ep>", "link", "one all-to-all>", "4 per layer>", "expert compute>", "comm / compute>"],
        [
            (ep, n, fmt_time(o), fmt_time(f), fmt_time(c), f"{r:.0%}")
            for ep, n, o, f, c, r in cluster_rows()
        ],  # fmt: skip
        caption="cost.predict('all_to_all', 'pairwise', k T h s, ep, link); compute at "
        f"{B200_FLOPS / 1e15:g} PFLOP/s, forward + backward = 3 x 4 k T h ffn",
    )
    rows = cluster_rows()
    page.check(
        rows[0][-1] < 1 < rows[1][-1], "ep inside an NVLink domain pays; over IB it does not"
    )


def imbalance_section(page: Page) -> None:
    page.prediction("a skewed router's imbalance, and the auxiliary loss pulling it back")
    page.say(
        "imbalance = the busiest expert's copies over the mean (1 when even, E when one expert "
        f"takes everything: {float(E):.2f} here); aux = E sum_e f_e P_e (1 when even)."
    )
    seen = skewed_router_run()
    page.measurement("SGD on the auxiliary loss alone (one process, 256 tokens, E = 4, top-1)")
    rows = [(i, f"{imb:.2f}", f"{aux:.3f}") for i, (imb, aux) in enumerate(seen)]
    page.table(None, ["step>", "imbalance>", "aux loss>"], rows)
    page.check(seen[0][0] > 2.5 and seen[-1][0] < 1.5, "the auxiliary loss evens the load")
    # the same statistic on real ranks: every rank of the group holds the whole layer's load
    moe, _ = layer(seed=1)
    with torch.no_grad():
        moe.router.gate.weight[0] += 0.5
    moe(tokens_of(page.rank, shift=0.5))
    stats = moe.last_stats
    page.say(f"on {page.size} ranks, a skewed router: {stats.summary(page.size)}")
    same = page.gather(stats.tokens_per_expert)
    page.check(all(s == same[0] for s in same), "every rank reports the same, whole-layer load")


def capacity_section(page: Page) -> None:
    cap = capacity(1.0, 1, T, E)
    page.prediction(f"capacity C = ceil(cf k T / E): {capacity(1.0, TOP_K, T, E)} at cf 1.0")
    page.say(
        f"A top-1 router that sends all {T} tokens of a rank to one expert, at capacity factor "
        f"1.0: C = ceil(1.0 x 1 x {T} / {E}) = {cap} kept, {T - cap} dropped per rank."
    )
    moe, _ = layer(capacity_factor=1.0, top_k=1)
    with torch.no_grad():
        moe.router.gate.weight.zero_()
        moe.router.gate.weight[0] += 1.0  # expert 0 wins every token that points its way
    moe(tokens_of(page.rank).abs())  # every feature positive: every token points that way
    stats = moe.last_stats
    page.measurement("moe.last_stats")
    page.say(f"  {stats.summary(page.size)}")
    page.check(
        stats.dropped == page.size * (T - cap),
        f"dropped {stats.dropped}: {T - cap} per rank, as the capacity formula says",
    )


def mesh_section(page: Page) -> None:
    page.prediction("the experts over ep of the dp ranks (groups.py; DeviceMesh(dp, ep=...))")
    rows = []
    for dp, ep in sorted({(4, 2), (page.size, max(1, page.size // 2))}):
        rows += [
            (f"dp={dp} ep={ep}", "expert parallel (tokens travel)",
             groups.expert_parallel_ranks(dp, ep), "2 all-to-alls each way per MoE layer"),
            ("", "expert data parallel (same experts)", groups.expert_data_parallel_ranks(dp, ep),
             "the experts' gradients, summed once a step"),
            ("", "data parallel (everything else)", [list(range(dp))], "DDP's all-reduce"),
        ]  # fmt: skip
    page.table(None, ["mesh", "groups", "ranks", "what moves"], rows)


# -- the labs ---------------------------------------------------------------------------------
def lab_no_counts(page: Page) -> None:
    page.section("Break-it lab: the dispatch without the count exchange")
    page.say(
        "Each rank assumes every rank sends it as many rows as it sends that rank. The router "
        "is skewed, and the ranks' tokens differ, so the guess is wrong."
    )
    moe, _ = layer(seed=1)
    with torch.no_grad():
        moe.router.gate.weight[0] += 0.5
    x = tokens_of(page.rank, shift=0.5 if page.rank == 0 else -0.5)
    good = moe(x)
    try:
        planted.moe_forward_without_counts(moe, x)
        outcome = "no error"
    except minipar.MessageSizeError as error:
        outcome = str(error)
    seen = page.gather(outcome)
    for rank, said in enumerate(seen):
        page.say(f"  rank {rank}: {said}")
    page.check(good.shape == x.shape, "the real layer, counts exchanged first, runs")
    page.check(
        all("sizes must match" in said for said in seen),
        "caught: minipar's transport refuses the message on every rank (sizes must match)",
    )


def lab_wrong_group(page: Page) -> None:
    p = page.size
    ep = max(1, p // 2) if E % max(1, p // 2) == 0 else 1
    page.section(f"Break-it lab: experts' gradients summed over the wrong ranks (dp={p}, ep={ep})")
    mesh = DeviceMesh(dp=p, ep=ep)
    moe, dense = layer(group=mesh.ep_group)
    x = tokens_of(page.rank)
    moe(x).square().mean().backward()  # each rank's loss: the mean over its own tokens
    everyone = torch.cat([tokens_of(r) for r in range(p)])
    ys = dense(everyone, groups=p).reshape(p, T, H)
    ys.square().mean(dim=(1, 2)).mean().backward()  # the mean of the ranks' means
    want = dense.experts.w1.grad[moe.first : moe.first + moe.n_local]
    saved = moe.experts.w1.grad.clone()
    groups.sync_expert_grads(moe, mesh.expert_dp_group, divide_by=p)
    right = close(moe.experts.w1.grad, want)
    moe.experts.w1.grad.copy_(saved)
    planted.sync_expert_grads_over_token_group(moe, mesh)
    wrong = close(moe.experts.w1.grad, want)
    seen = page.gather((right, wrong))
    page.table(
        None,
        ["rank", "over expert_dp_group>", "over ep_group (planted)>"],
        [(r, f"{a:.1e}", f"{b:.0%}") for r, (a, b) in enumerate(seen)],
    )
    page.say(f"expert dp groups: {mesh.shape.expert_dp_groups()}; ep groups: "
             f"{mesh.shape.expert_groups()}")  # fmt: skip
    page.check(all(a < 1e-5 for a, _ in seen), "the right group gives the dense gradient")
    page.check(
        all(b > 0.1 for _, b in seen),
        "caught: the comparison with the dense twin finds the experts' gradients wrong",
    )


def main(argv=None) -> int:
    page = Page(
        "10", "Mixture of experts: expert parallelism", ("no-counts", "wrong-group"), argv=argv,
        min_ranks=2,
    )  # fmt: skip
    if page.enough and page.lab == "no-counts":
        lab_no_counts(page)
    elif page.enough and page.lab == "wrong-group":
        lab_wrong_group(page)
    elif page.enough and E % page.size:
        page.check(False, f"E = {E} experts split over the ranks: run it with -n 2 or -n 4")
    elif page.enough:
        twin_section(page)
        bytes_section(page)
        cluster_section(page)
        imbalance_section(page)
        capacity_section(page)
        mesh_section(page)
        page.try_this(
            [
                "minipar lesson 10 -n 4: predict the all-to-all's bytes first.",
                "Set TOP_K = 1: the all-to-all becomes half an all-reduce of the activations.",
                "Write the dispatch yourself: exercises/ex10_moe_dispatch.py, then "
                "`minipar grade 10`.",
                "minipar bench moe: the layer at ep = 2 against every expert local.",
                "minipar train --moe --experts 4 --ep 2 --check: the tiny GPT with MoE blocks.",
            ]
        )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
