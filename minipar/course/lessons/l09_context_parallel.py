"""Lesson 09: long sequences, context parallelism (text: lessons/09_context_parallel.md).

    minipar lesson 09 -n 4                     # minipar.course.lessons.l09_context_parallel
    minipar lesson 09 --break forget-rescale   # a merge without the running maximum, caught
    minipar lesson 09 --break naive-split      # causal ring attention on contiguous blocks

One attention (8 heads of 64, 1024 tokens, float32) with its sequence over the ranks: why the
sequence is what runs out of memory, ring attention's K/V bytes per step predicted and read off
the ledger, its output against dense attention (scores in the hundreds too), the causal work
per rank without and with the load-balanced layout (counted by ContextStats), the activations
autograd saves per rank, and ring against Ulysses: messages, bytes, and when the ring's
messages hide behind its compute.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch.nn import functional as F

import minipar
from minipar.course import claims as C
from minipar.course.lessons import planted
from minipar.course.lessons.l04_topology_bandwidth import link_between_nodes
from minipar.course.lessons.page import Page, fmt_bytes, fmt_rate
from minipar.course.machine import link_bits
from minipar.launcher.cluster import link as wires
from minipar.parallel.activation_memory import saved_bytes
from minipar.parallel.context import (
    ContextStats,
    online_softmax,
    ring_attention,
    shard_sequence,
    ulysses_attention,
)

B, HEADS, S, D = 1, 8, 1024, 64  # the lesson's attention: one sequence, float32
FLOAT = 4
VARIANTS = {"ring": ring_attention, "ulysses": ulysses_attention}

# section 1: a 70B-class model (hidden 8192, 80 layers), one sequence of 128k tokens, 16-bit,
# ~34 bytes per token per hidden unit per layer (Korthikanti et al. 2022, flash attention)
LONG, BIG_H, BIG_LAYERS, PER_TOKEN, TP = 131072, 8192, 80, 34, 8
H100_FLOPS, NVLINK_BW, IB_BW = 1e15, 450e9, 50e9  # bf16 dense; bytes/s one way


# -- the formulas (claims(): what the text states) --------------------------------------------
def shard_bytes(cp: int) -> int:
    """N: one rank's shard of q (or k, v, out), (B, HEADS, S/cp, D) float32."""
    return B * HEADS * (S // cp) * D * FLOAT


def saved_bytes_predicted(cp: int, variant: str = "ring", causal: bool = True) -> int:
    """What autograd keeps per rank: q, k, v, out and the log-sum-exp (B, HEADS, S/cp), all
    1/cp of dense attention's; Ulysses' causal reordering also keeps 2 int64 vectors of S."""
    extra = 2 * 8 * S if variant == "ulysses" and causal and cp > 1 else 0
    return (4 * shard_bytes(cp) + B * HEADS * (S // cp) * FLOAT) + extra


def scores(cp: int, rank: int, balanced: bool) -> tuple[int, int]:
    """(block products, scores) of a rank's causal ring forward: contiguous blocks, rank r
    does r + 1 full L x L products; load-balanced, the L x L diagonal then cp - 1 halves."""
    n = S // cp
    if balanced and cp > 1:
        return cp, B * HEADS * (n * n + (cp - 1) * n * n // 2)
    return rank + 1, (rank + 1) * B * HEADS * n * n


def ring_bytes(cp: int) -> tuple[int, int]:
    """(forward, backward) bytes a rank sends: cp - 1 K/V blocks of 2N; then the K/V again
    and the dK/dV (float32) behind them."""
    return (cp - 1) * 2 * shard_bytes(cp), 2 * (cp - 1) * 2 * shard_bytes(cp)


def ulysses_bytes(cp: int) -> int:
    """Forward bytes a rank sends: 4 all-to-alls, each (cp - 1)/cp of one shard."""
    return 4 * (cp - 1) * shard_bytes(cp) // cp


def round_1(x: float) -> int:
    """x to one significant digit: 2222 -> 2000."""
    digits = len(str(int(x))) - 1
    return int(round(x / 10**digits) * 10**digits)


def messages_row(cp: int) -> str:
    """A row of the text's table: cp, ring messages and bytes, Ulysses' (N: one shard)."""
    ulysses = 4 * (cp - 1) / cp
    return f"| {cp} | {cp - 1} | {2 * (cp - 1)} N | {4 * (cp - 1)} | {ulysses:.3g} N |".replace(
        ".0 N", " N"
    )


def claims() -> list[str]:
    """Numbers lessons/09_context_parallel.md states; tests/test_lessons.py checks the text."""
    layer = LONG * BIG_H * PER_TOKEN
    out = [
        f"{layer / 1e9:.1f} GB per layer",
        f"{layer * BIG_LAYERS / 1e12:.1f} TB for the model",
        f"still {layer * BIG_LAYERS / TP / 1e9:.0f} GB",
        f"| 1 | {saved_bytes_predicted(1):,} B | {saved_bytes_predicted(1):,} B | "
        f"{saved_bytes_predicted(1, 'ulysses'):,} B |",
    ]
    for cp in (2, 4):
        out.append(
            f"| {cp} | | {saved_bytes_predicted(cp):,} B | "
            f"{saved_bytes_predicted(cp, 'ulysses'):,} B |"
        )
    for r in range(4):  # cp = 4
        (nb, ns), (bb, bs) = scores(4, r, False), scores(4, r, True)
        out.append(f"| {r} | {nb} | {ns:,} | {bb} | {bs:,} |")
    total = sum(scores(4, r, True)[1] for r in range(4))
    assert total == sum(scores(4, r, False)[1] for r in range(4))
    out += [f"({total:,}, 5/8 of the dense {B * HEADS * S * S:,}"]
    out += [messages_row(cp) for cp in (2, 4, 8)]
    out.append(f"{ring_bytes(2)[0]:,} B both at cp = 2")
    out += [f"{ring_bytes(4)[0]:,}", f"{ulysses_bytes(4):,} B at cp = 4"]
    out.append(f"about {round_1(H100_FLOPS / NVLINK_BW):,} tokens per rank")
    out.append(f"about {round_1(H100_FLOPS / IB_BW):,} over InfiniBand")
    return out


# -- the live attention -----------------------------------------------------------------------
def inputs(scale: float = 1.0, seed: int = 0):
    """The same full q, k, v and upstream gradient on every rank (q and k times `scale`)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, dy = (torch.randn(B, HEADS, S, D, generator=g) for _ in range(4))
    return q * scale, k * scale, v, dy


def close(a, b) -> float:
    """Largest |a - b| relative to max |b| (inf when a has NaN or inf)."""
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def attention_on_ranks(variant, tensors, group=None, causal=True, balanced=True, stats=None):
    """(this rank's output and q's gradient, the ledgers of forward and backward)."""
    q, k, v, dy = tensors
    layout = causal and balanced
    shards = [shard_sequence(t, 2, group, layout).requires_grad_() for t in (q, k, v)]
    with minipar.trace() as fwd:
        out = VARIANTS[variant](*shards, group=group, causal=causal, balanced=balanced,
                                stats=stats)  # fmt: skip
    with minipar.trace() as bwd:
        (out * shard_sequence(dy, 2, group, layout)).sum().backward()
    return out.detach(), shards[0].grad, fwd, bwd


def dense_shards(tensors, group=None, causal=True, balanced=True):
    """This rank's shard of dense attention's output and q gradient on the full sequence."""
    q, k, v, dy = (t.clone().requires_grad_() for t in tensors)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    (out * dy).sum().backward()
    layout = causal and balanced
    return (shard_sequence(t.detach(), 2, group, layout) for t in (out, q.grad))


def why_section(page: Page) -> None:
    layer = LONG * BIG_H * PER_TOKEN
    page.prediction("the activations of one 128k-token sequence, 70B-class model, 16-bit")
    page.table(
        None,
        ["what", "bytes>"],
        [
            (f"one layer: {LONG} x {BIG_H} x {PER_TOKEN} B", f"{layer / 1e9:.1f} GB"),
            (f"{BIG_LAYERS} layers", f"{layer * BIG_LAYERS / 1e12:.1f} TB"),
            (f"with TP = {TP} (and sequence parallel)", f"{layer * BIG_LAYERS / TP / 1e9:.0f} GB"),
        ],
        caption="per-token activations split for free; only attention needs every key",
    )


def ring_section(page: Page) -> None:
    cp = page.size
    kv = 2 * shard_bytes(cp)
    fwd_b, bwd_b = ring_bytes(cp)
    page.prediction(
        f"ring attention on cp = {cp}: (batch, heads, seq, d) = ({B}, {HEADS}, {S}, {D})"
    )
    page.say(
        f"A K/V block: 2 x {B} x {HEADS} x {S // cp} x {D} x 4 B = {fmt_bytes(kv)}; forward "
        f"cp - 1 = {cp - 1} of them per rank ({fwd_b:,} B), backward the K/V again and the dK/dV "
        f"behind them ({bwd_b:,} B)."
    )
    tensors = inputs()
    out, dq, fwd, bwd = attention_on_ranks("ring", tensors)
    want_out, want_dq = dense_shards(tensors)
    big = inputs(scale=8.0)  # scores up to a few hundred: exp(score) overflows float32
    big_out, _, _, _ = attention_on_ranks("ring", big)
    big_want, _ = dense_shards(big)
    mine = {
        "sends": [m.nbytes for m in fwd.messages if m.collective == "p2p" and m.kind == "send"],
        "fwd": fwd.bytes_sent("p2p"),
        "bwd": bwd.bytes_sent("p2p"),
        "err": max(close(out, want_out), close(dq, want_dq)),
        "big": close(big_out, big_want),
    }
    seen = page.gather(mine)
    page.measurement("each rank's ledger, and its shard against dense attention")
    rows = [(r, len(s["sends"]), f"{s['fwd']:,}", f"{s['bwd']:,}", f"{s['err']:.1e}",
             f"{s['big']:.1e}") for r, s in enumerate(seen)]  # fmt: skip
    page.table(None, ["rank", "K/V sends>", "forward B>", "backward B>", "error>",
                      "error, scores x 64>"], rows)  # fmt: skip
    page.check(all(s["sends"] == [kv] * (cp - 1) for s in seen), "cp - 1 K/V blocks forward")
    page.check(all((s["fwd"], s["bwd"]) == (fwd_b, bwd_b) for s in seen), "backward: twice that")
    page.check(all(s["err"] < 1e-5 for s in seen), "output and dq equal dense attention's")
    page.check(all(s["big"] < 5e-5 for s in seen), "so do they with scores in the hundreds")


def work_section(page: Page) -> None:
    cp = page.size
    page.prediction(f"the causal work per rank, cp = {cp}: contiguous blocks or load-balanced")
    rows = []
    for r in range(cp):
        (nb, ns), (bb, bs) = scores(cp, r, False), scores(cp, r, True)
        rows.append((r, nb, f"{ns:,}", bb, f"{bs:,}"))
    columns = ["rank", "contiguous: blocks>", "scores>", "load-balanced: blocks>", "scores>"]
    page.table(None, columns, rows)
    tensors = inputs(seed=1)
    counted = {}
    for balanced in (False, True):
        stats = ContextStats()
        attention_on_ranks("ring", tensors, balanced=balanced, stats=stats)
        counted[balanced] = (stats.forward_blocks, stats.forward_scores)
    seen = page.gather(counted)
    page.measurement("ContextStats on each rank (forward)")
    rows = [(r, *s[False][:1], f"{s[False][1]:,}", *s[True][:1], f"{s[True][1]:,}")
            for r, s in enumerate(seen)]  # fmt: skip
    page.table(None, columns, rows)
    page.check(
        all(
            s[False] == scores(cp, r, False) and s[True] == scores(cp, r, True)
            for r, s in enumerate(seen)
        ),  # fmt: skip
        "every rank's block products are the formula's",
    )
    page.check(len({s[True] for s in seen}) == 1, "load-balanced: every rank the same work")


def memory_section(page: Page) -> None:
    cp = page.size
    page.prediction(f"the activations attention saves per rank (q, k, v, out, lse), cp = {cp}")
    page.say(
        f"4 x (batch x heads x S/cp x d) + batch x heads x S/cp values, float32: 4 x "
        f"{shard_bytes(cp):,} + {B * HEADS * (S // cp) * FLOAT:,} B; Ulysses' causal reordering "
        f"adds 2 int64 vectors of S = {2 * 8 * S:,} B."
    )
    q, k, v, _ = inputs(seed=2)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    dense = saved_bytes(lambda: F.scaled_dot_product_attention(*full, is_causal=True))
    shards = [shard_sequence(t, 2, causal=True).requires_grad_() for t in (q, k, v)]
    measured = {
        name: saved_bytes(lambda fn=fn: fn(*shards, causal=True)) for name, fn in VARIANTS.items()
    }
    seen = page.gather(measured)
    rows = [("dense (one rank)", f"{saved_bytes_predicted(1):,}", f"{dense:,}")]
    for name in VARIANTS:
        got = sorted({s[name] for s in seen})
        rows.append((f"{name}, per rank", f"{saved_bytes_predicted(cp, name):,}",
                     ", ".join(f"{g:,}" for g in got)))  # fmt: skip
    page.measurement("autograd's saved tensors (torch.autograd.graph.saved_tensors_hooks)")
    page.table(None, ["attention", "predicted B>", "measured B>"], rows)
    page.check(dense == saved_bytes_predicted(1), "dense attention saves what the formula says")
    page.check(
        all(s[n] == saved_bytes_predicted(cp, n) for s in seen for n in VARIANTS),
        f"ring and Ulysses save 1/cp = 1/{cp} of it (Ulysses: + 2 index vectors)",
    )


def versus_section(page: Page) -> None:
    cp = page.size
    page.prediction("ring against Ulysses, per rank per attention layer, forward")
    page.table(
        None,
        ["cp>", "ring: messages>", "ring: bytes>", "Ulysses: messages>", "Ulysses: bytes>"],
        [tuple(c.strip() for c in messages_row(n).strip("|").split("|")) for n in (2, 4, 8)],
        caption="N = one rank's shard of q; Ulysses needs heads divisible by cp",
    )
    tensors = inputs(seed=3)
    ledgers = {name: attention_on_ranks(name, tensors)[2] for name in VARIANTS}
    mine = {
        "ring": (len([m for m in ledgers["ring"].messages
                      if m.collective == "p2p" and m.kind == "send"]),
                 ledgers["ring"].bytes_sent("p2p")),
        "ulysses": (sum(c.steps for c in ledgers["ulysses"].calls
                        if c.collective == "all_to_all"),
                    ledgers["ulysses"].bytes_sent("all_to_all")),
    }  # fmt: skip
    seen = page.gather(mine)
    page.measurement(f"the ledger at cp = {cp} ({S} tokens, {HEADS} heads, float32)")
    rows = [(r, s["ring"][0], f"{s['ring'][1]:,}", s["ulysses"][0], f"{s['ulysses'][1]:,}")
            for r, s in enumerate(seen)]  # fmt: skip
    page.table(None, ["rank", "ring: messages>", "ring: B>", "Ulysses: messages>",
                      "Ulysses: B>"], rows)  # fmt: skip
    page.check(
        all(s["ring"] == (cp - 1, ring_bytes(cp)[0]) for s in seen),
        "ring: cp - 1 messages of 2N",
    )
    page.check(
        all(s["ulysses"] == (4 * (cp - 1), ulysses_bytes(cp)) for s in seen),
        "Ulysses: 4 all-to-alls of (cp - 1) messages, (cp - 1)/cp N each",
    )
    nv, ib = round_1(H100_FLOPS / NVLINK_BW), round_1(H100_FLOPS / IB_BW)
    page.say(
        f"The ring hides a K/V message (4 L d bytes, bf16) behind its block product (4 L^2 d "
        f"FLOPs) once L > FLOP/s over bytes/s: about {nv:,} tokens per rank on an H100 over "
        f"NVLink, about {ib:,} over InfiniBand NDR. Ulysses' all-to-alls hide behind nothing."
    )


# -- the labs ---------------------------------------------------------------------------------
@contextlib.contextmanager
def merge_swapped(merge):
    """minipar's ring attention with another merge inside it (as the exercise grader does)."""
    own = online_softmax.merge
    online_softmax.merge = merge
    try:
        yield
    finally:
        online_softmax.merge = own


def lab_forget_rescale(page: Page) -> None:
    page.section("Break-it lab: a merge that weighs the blocks by exp(lse) itself")
    rows, errors = [], {}
    for scale, what in ((1.0, "ordinary scores"), (8.0, "scores x 64: in the hundreds")):
        tensors = inputs(scale=scale, seed=4)
        want, _ = dense_shards(tensors)
        good = attention_on_ranks("ring", tensors)[0]
        with merge_swapped(planted.merge_without_rescale):
            bad = attention_on_ranks("ring", tensors)[0]
        errors[what] = (close(good, want), close(bad, want))
    seen = page.gather(errors)
    for what in errors:
        good, bad = max(s[what][0] for s in seen), max(s[what][1] for s in seen)
        rows.append((what, f"{good:.1e}", "NaN / inf" if bad == float("inf") else f"{bad:.1e}"))
    page.table(None, ["inputs", "minipar's merge: error>", "planted merge: error>"], rows)
    ordinary, large = list(errors)
    page.check(
        all(s[ordinary][1] < 1e-4 for s in seen), "ordinary inputs: the planted merge passes"
    )
    page.check(all(s[large][0] < 5e-5 for s in seen), "minipar's merge survives large scores")
    page.check(
        all(s[large][1] == float("inf") for s in seen),
        "caught: with scores in the hundreds exp(lse) overflows and the planted merge gives NaN",
    )


def lab_naive_split(page: Page) -> None:
    cp = page.size
    page.section("Break-it lab: causal ring attention on contiguous blocks")
    q, k, v, dy = inputs(seed=5)
    shards = [planted.shard_sequence_naive(t, 2).requires_grad_() for t in (q, k, v)]
    stats = ContextStats()
    out = ring_attention(*shards, causal=True, balanced=False, stats=stats)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    err = close(out.detach(), shard_sequence(full, 2))  # the contiguous block of the output
    seen = page.gather((err, stats.forward_blocks, stats.forward_scores))
    page.table(None, ["rank", "error>", "blocks>", "scores>"],
               [(r, f"{e:.1e}", b, f"{s:,}") for r, (e, b, s) in enumerate(seen)])  # fmt: skip
    page.check(all(e < 1e-5 for e, _, _ in seen), "every value is right: the dense check passes")
    page.check(
        seen[-1][2] == cp * seen[0][2] and cp > 1,
        f"caught: ContextStats shows rank {cp - 1} doing {cp} x rank 0's work; every ring step "
        "waits for it",
    )


def flop_rate(length: int, reps: int = 5) -> float:
    """This rank's float32 matmul rate at attention's shape (length x D by D x length)."""
    a, b = torch.randn(HEADS, length, D), torch.randn(HEADS, D, length)
    torch.matmul(a, b)  # warm up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * HEADS * length * length * D / best


def nodes_section(page: Page) -> None:
    """On emulated (or real) nodes: the sequence length per rank at which ring attention's
    K/V messages hide behind its compute on the link between nodes, predicted from the link and
    this machine's FLOP rate, then found by measurement (ContextStats' wait against compute)."""
    node_of = minipar.node_map()
    if len(set(node_of)) < 2:
        page.say(
            "(`minipar lesson 09 --nodes 2` as root finds where the ring hides on a slow link.)"
        )
        return
    link, rate = link_between_nodes(page, node_of), min(page.gather(flop_rate(512)))
    hides_at = 2 * link.beta * rate  # 4 L^2 d H / F = 2 L d H 4 bytes * beta, per block
    page.prediction(f"ring attention over {page.size} ranks on {len(set(node_of))} nodes")
    page.say(f"The nodes are joined by an emulated link of {wires.describe(link_bits())}.")
    page.say(
        f"A step computes 4 L^2 d FLOPs per head and forwards 2 L d float32 (K and V) per head: "
        f"compute {rate / 1e9:.3g} GFLOP/s here, the link {fmt_rate(1 / link.beta)} between "
        f"nodes, so the K/V block hides once L > 2 beta F = {hides_at:,.0f} tokens per rank "
        f"(the text's H100 figures: {round_1(H100_FLOPS / IB_BW):,} over InfiniBand)."
    )
    rows, exposed = [], []
    for length in (128, 512) if page.quick else (128, 512, 1024, 2048):
        q, k, v = (torch.randn(B, HEADS, length * page.size, D) for _ in range(3))
        shards = [shard_sequence(t, 2, None, False) for t in (q, k, v)]
        stats = ContextStats()
        ring_attention(*shards, causal=False, stats=stats)
        waited, computed = max(page.gather((stats.wait_seconds, stats.compute_seconds)))
        exposed.append(waited / (waited + computed))
        rows.append((f"{length:,}", fmt_bytes(2 * B * HEADS * length * D * FLOAT),
                     f"{computed * 1e3:.1f} ms", f"{waited * 1e3:.1f} ms",
                     f"{100 * exposed[-1]:.0f} %"))  # fmt: skip
    page.observe("matmul rate (float32)", rate, "FLOP/s")
    page.observe("link bandwidth between nodes", 1 / link.beta, "B/s")
    page.observe("tokens per rank at which the K/V block hides", hides_at, "tokens")
    for length, share in zip((128, 512) if page.quick else (128, 512, 1024, 2048), exposed):
        page.observe(f"exposed share at {length} tokens per rank", share, "fraction")
    page.measurement("one forward per length (the slowest rank's waits and compute)")
    page.table(None, ["tokens/rank>", "K/V block>", "compute>", "waited>", "exposed>"], rows)
    page.claim("longer sequences hide more of the K/V messages (exposed share, longest / "
               "shortest)", 1.0, exposed[-1] / max(exposed[0], 1e-12), "x", C.at_most(),
               basis=f"link between nodes {wires.describe(link_bits())}",
               reference="each length's own forward (waits / (waits + compute))")  # fmt: skip


def main(argv=None) -> int:
    page = Page(
        "09", "Long sequences: context parallelism", ("forget-rescale", "naive-split"),
        argv=argv, min_ranks=2,
    )  # fmt: skip
    if page.enough and HEADS % page.size:
        page.check(False, f"{HEADS} heads split over the ranks for Ulysses: -n 2, 4 or 8")
    elif page.enough and page.lab == "forget-rescale":
        lab_forget_rescale(page)
    elif page.enough and page.lab == "naive-split":
        lab_naive_split(page)
    elif page.enough:
        why_section(page)
        ring_section(page)
        work_section(page)
        memory_section(page)
        versus_section(page)
        nodes_section(page)
        page.try_this(
            [
                "minipar lesson 09 -n 2: which numbers halve, which stay?",
                "Write the merge and the split yourself: exercises/ex09_online_softmax_merge.py, "
                "ex09_load_balanced_split.py, then `minipar grade 09`.",
                "minipar bench cp: ring and Ulysses against dense attention on one rank.",
                "minipar train --cp 2 --cp-variant ulysses --check: the tiny GPT, its sequence "
                "over 2 ranks.",
                "minipar plan --model 70b --seq 131072 --batch 16 --gpus 64 --cp 8 --recompute: "
                "what does the planner choose?",
            ]
        )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
