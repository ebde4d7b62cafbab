"""Lesson 06: tensor parallelism (text: lessons/06_tensor_parallel.md).

    minipar lesson 06 -n 2                      # minipar.course.lessons.l06_tensor_parallel
    minipar lesson 06 --break bias-every-rank   # a row-parallel bias added p times, caught

One linear layer split two ways (by output features: no message forward; by input features: an
all-reduce), Megatron's f and g as a pair, a transformer block's messages counted live from the
trace ledger against the prediction, and the cost model on B200 nodes: why tensor parallelism
stays inside one NVLink domain.
"""

from __future__ import annotations

import torch
from torch import nn

import minipar
from minipar import cost
from minipar.course.lessons import planted
from minipar.course.lessons.page import Page, fmt_bytes, fmt_time
from minipar.parallel.tensor import (
    ColumnParallelLinear,
    DenseMLP,
    DenseSelfAttention,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
)

B, S, H, HEADS = 2, 8, 16, 4  # the live examples: tiny, so every rank fits the CPU easily

# the cluster model: a 70B-class layer, bf16, one micro-batch of 4 x 2048 tokens
BIG_H, BIG_TOKENS, BF16 = 8192, 4 * 2048, 2
B200_FLOPS = 2.25e15  # dense BF16 matmul, NVIDIA HGX B200 datasheet (per GPU)


def close(a, b) -> float:
    """Largest |a - b| relative to max |b|."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def traced(fn):
    """(result, trace) of fn() on this rank."""
    with minipar.trace() as t:
        out = fn()
    return out, t


# -- 1. one linear layer, split two ways -------------------------------------------------------
def split_section(page: Page) -> None:
    p = page.size
    page.prediction(f"Y = X A^T + b, A of shape (out, in) = ({4 * H}, {H}), split over {p} ranks")
    page.table(
        None,
        ["split", "this rank holds", "forward needs", "backward needs"],
        [
            ("column (out features)", "rows of A and b", "nothing: X is whole", "all-reduce dX"),
            ("row (in features)", "columns of A, all of b", "all-reduce partial Y", "nothing"),
        ],
    )
    torch.manual_seed(0)
    dense_col, dense_row = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)
    col, row = ColumnParallelLinear.from_dense(dense_col), RowParallelLinear.from_dense(dense_row)
    x = torch.randn(B, S, H)
    y_col, t_col = traced(lambda: col(x))
    hidden = dense_col(x).chunk(p, dim=-1)[page.rank].detach()
    y_row, t_row = traced(lambda: row(hidden))
    page.measurement("forward of each, under minipar.trace()")
    page.table(
        None,
        ["layer", "output shape", "collectives", "bytes sent>", "error vs dense>"],
        [
            (
                "column",
                tuple(y_col.shape),
                _names(t_col),
                t_col.bytes_sent(),
                _col_err(y_col, dense_col(x), page),
            ),
            (
                "row",
                tuple(y_row.shape),
                ", ".join(c.collective for c in t_row.calls) or "-",
                t_row.bytes_sent(),
                f"{close(y_row, dense_row(dense_col(x))):.1e}",
            ),
        ],
    )
    page.check(not t_col.messages, "the column split sends nothing forward")
    page.check(
        [c.collective for c in t_row.calls] == (["all_reduce"] if p > 1 else []),
        "the row split's partial sums need exactly one all-reduce",
    )


def _col_err(y, full, page) -> str:
    return f"{close(y, full.chunk(page.size, dim=-1)[page.rank]):.1e}"


# -- 2. f and g ---------------------------------------------------------------------------------
def pair_section(page: Page) -> None:
    page.prediction("column then row (the MLP): f before, g after, each the other's transpose")
    page.table(
        None,
        ["operator", "forward", "backward", "where"],
        [
            ("f", "identity", "all-reduce", "entering: fc1's input"),
            ("g", "all-reduce", "identity", "leaving: fc2's output"),
        ],
    )
    torch.manual_seed(1)
    dense = DenseMLP(H, 4 * H)
    mlp = ParallelMLP.from_dense(dense)
    x = torch.randn(B, S, H, requires_grad=True)
    y, fwd = traced(lambda: mlp(x))
    _, bwd = traced(lambda: y.sum().backward())
    page.measurement("ParallelMLP forward and backward, traced")
    page.table(
        None,
        ["pass", "collectives", "bytes sent>"],
        [("forward", _names(fwd), fwd.bytes_sent()), ("backward", _names(bwd), bwd.bytes_sent())],
    )
    want = ["all_reduce"] if page.size > 1 else []
    page.check(
        [c.collective for c in fwd.calls] == want and [c.collective for c in bwd.calls] == want,
        "one all-reduce forward (g), one backward (f)",
    )
    x2 = x.detach().clone().requires_grad_()
    dense(x2).sum().backward()
    page.check(close(x.grad, x2.grad) < 1e-5, "the input gradient equals the dense MLP's")


def _names(t) -> str:
    return ", ".join(c.collective for c in t.calls) or "-"


# -- 3. a transformer layer's messages, counted live -------------------------------------------
class Block(nn.Module):
    def __init__(self, attn, mlp):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(H), attn, nn.LayerNorm(H), mlp

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def block_section(page: Page) -> None:
    p, n = page.size, B * S * H * 4
    ring = cost.traffic("all_reduce", "ring", n, max(p, 2)).bytes_sent
    page.prediction(f"one transformer layer, (b, s, h) = ({B}, {S}, {H}), float32, t = {p}")
    page.say(
        f"Megatron: 2 all-reduces forward (after attention, after the MLP) and 2 backward (their "
        f"inputs' gradients), each of b*s*h = {B * S * H} elements = {fmt_bytes(n)}; a ring sends "
        f"2(t-1)/t of that per rank: {fmt_bytes(ring)} each."
    )
    torch.manual_seed(2)
    block = Block(
        ParallelSelfAttention.from_dense(DenseSelfAttention(H, HEADS)),
        ParallelMLP.from_dense(DenseMLP(H, 4 * H)),
    )
    x = torch.randn(B, S, H, requires_grad=True)
    y, fwd = traced(lambda: block(x))
    _, bwd = traced(lambda: y.sum().backward())
    rows = [
        ("forward", len(fwd.calls), _names(fwd), fmt_bytes(fwd.bytes_sent())),
        ("backward", len(bwd.calls), _names(bwd), fmt_bytes(bwd.bytes_sent())),
    ]
    page.measurement("the layer's ledger (this rank; algorithm picked by `auto`)")
    page.table(None, ["pass", "calls>", "collectives", "bytes sent>"], rows)
    if p > 1:
        page.check(len(fwd.calls) == 2 and len(bwd.calls) == 2, "2 all-reduces each way")
        per_call = [c.bytes_sent for c in fwd.calls + bwd.calls]
        exact = [cost.traffic("all_reduce", c.algorithm, n, p) for c in fwd.calls + bwd.calls]
        page.check(
            all(b == e.bytes_sent for b, e in zip(per_call, exact) if e.exact),
            "each sends what minipar.cost's formula says for b*s*h elements",
        )


# -- 4. why it stays inside the node -----------------------------------------------------------
def cluster_rows():
    """(t, link, compute per layer, communication per layer, comm / compute) for one 70B-class
    layer (h = 8192, 8192 tokens, bf16), forward + backward."""
    rows = []
    for t in (2, 4, 8):
        flops = 3 * 24 * BIG_TOKENS * BIG_H**2 / t  # fwd 24 b s h^2 (4 matmuls), bwd twice that
        compute = flops / B200_FLOPS
        for link in (cost.NVLINK5, cost.IB_NDR):
            comm = 4 * cost.predict("all_reduce", "ring", BIG_TOKENS * BIG_H * BF16, t, link)
            rows.append((t, link.name, compute, comm, comm / compute))
    return rows


def claims() -> list[str]:
    """Numbers lessons/06_tensor_parallel.md states; tests/test_lessons.py checks the text."""
    rows = {(t, name): (c, m, r) for t, name, c, m, r in cluster_rows()}
    out = [fmt_bytes(BIG_TOKENS * BIG_H * BF16)]
    for key in ((8, "nvlink5"), (8, "ib_ndr"), (2, "nvlink5")):
        compute, comm, ratio = rows[key]
        out += [fmt_time(compute), fmt_time(comm), f"{ratio:.0%}"]
    return out


def cluster_section(page: Page) -> None:
    page.prediction(
        f"one 70B-class layer (h = {BIG_H}, {BIG_TOKENS} tokens, bf16) on B200s: compute vs the "
        f"4 all-reduces of {fmt_bytes(BIG_TOKENS * BIG_H * BF16)}"
    )
    page.table(
        None,
        ["t>", "link", "compute>", "communication>", "comm / compute>"],
        [(t, n, fmt_time(c), fmt_time(m), f"{r:.0%}") for t, n, c, m, r in cluster_rows()],
        caption=f"compute at {B200_FLOPS / 1e15:g} PFLOP/s (dense BF16); comm: cost.predict, "
        "ring, no overlap",
    )
    rows = {(t, name): r for t, name, _, _, r in cluster_rows()}
    page.check(rows[8, "nvlink5"] < 1 < rows[8, "ib_ndr"], "TP=8 pays on NVLink, not over IB")


# -- the lab ------------------------------------------------------------------------------------
def lab_bias_every_rank(page: Page) -> None:
    p = page.size
    page.section("Break-it lab: the row-parallel bias added on every rank, before the all-reduce")
    torch.manual_seed(3)
    dense = nn.Linear(4 * H, H)
    row = RowParallelLinear.from_dense(dense)
    x = torch.randn(B, S, 4 * H)
    mine = x.chunk(p, dim=-1)[page.rank]
    want = dense(x).detach()
    good = row(mine).detach()
    bad = planted.row_parallel_bias_every_rank(row, mine).detach()
    extra = (bad - want).mean(dim=(0, 1))
    page.table(
        None,
        ["forward", "error vs dense>"],
        [("RowParallelLinear", f"{close(good, want):.1e}"), ("planted", f"{close(bad, want):.1e}")],
    )
    page.say(f"The planted output minus the dense one, per feature: {p - 1} x the bias?")
    page.check(close(good, want) < 1e-5, "the real layer matches its dense twin")
    page.check(
        close(bad, want) > 1e-3 and close(extra, (p - 1) * dense.bias.detach()) < 1e-4,
        f"caught: the planted output is off by exactly (p - 1) x bias = {p - 1} x bias",
    )


def main(argv=None) -> int:
    page = Page("06", "Tensor parallelism", ("bias-every-rank",), argv=argv, min_ranks=2)
    if page.enough and page.lab:
        lab_bias_every_rank(page)
    elif page.enough:
        split_section(page)
        pair_section(page)
        block_section(page)
        cluster_section(page)
        page.try_this(
            [
                "minipar lesson 06 -n 4: the ring's share 2(t-1)/t grows with t.",
                "Write the column and row layers yourself: exercises/ex06_*.py, then "
                "`minipar grade 06`.",
                "Set sequence_parallel=True in block_section: all-gathers and reduce-scatters "
                "replace the all-reduces; do the bytes change?",
                "minipar bench tp: the MLP and attention against torch's tensor parallelism.",
                "minipar lesson 06 --break bias-every-rank: why does a zero-initialised bias "
                "hide this bug?",
            ]
        )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
