"""What crosses the network in an expert-parallel layer: the counts, then the tokens, twice.

    1. counts    all-gather of 3 + 2E int64 per rank (a header: the input's hidden size and
                 dtype, its tokens; then this rank's copies per expert, kept and routed):
                 every rank learns how many rows it will receive from each rank, the whole
                 layer's load and drops, and whether every rank's input agrees, before any
                 token moves. Ring: (p-1) (3+2E) 8 bytes sent per rank, p-1 steps.
    2. dispatch  all-to-all of the sorted copies: block q (splits[q] rows) to rank q.
    3. combine   all-to-all of the experts' outputs back: the same blocks, the other way.

Steps 2 and 3 are `collectives.all_to_all_single` with split sizes (uneven: "auto" means pairwise,
p-1 steps). The block a rank keeps for itself is copied, never sent: the bytes a rank sends per
all-to-all are its off-rank rows x hidden x dtype size. Over one layer, dispatch + combine, every
off-rank copy crosses twice forward and twice backward.

    rank 0 [e0 e1 | e2 e3]       rank 0 gets (own e0 e1) + (rank 1's e0 e1)
    rank 1 [e0 e1 | e2 e3]  -->  rank 1 gets (rank 0's e2 e3) + (own e2 e3)
              keep  send

`AllToAll` is an autograd function whose backward is the same exchange reversed: the gradient of
"row i goes from rank a to rank b" is "its gradient goes from b to a", so backward swaps the
split sizes.
"""

from __future__ import annotations

import torch

from minipar import collectives, runtime

HEADER = ("hidden", "dtype", "tokens")  # the count vector's first entries
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def dtype_code(dtype) -> int:
    return DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES)


def dtype_name(code: int) -> str:
    return str(DTYPES[code]).replace("torch.", "") if 0 <= code < len(DTYPES) else "other"


def header(x: torch.Tensor) -> list:
    """What this rank's input is: its last dimension (-1 for a scalar), dtype and tokens."""
    hidden = x.shape[-1] if x.dim() else -1
    return [hidden, dtype_code(x.dtype), x.numel() // max(hidden, 1)]


def exchange_counts(header: list, kept, routed, group) -> torch.Tensor:
    """(p, 3 + 2E) int64 on every rank: each rank's header, then its copies per expert, kept
    and routed (lists or tensors of E ints)."""
    values = [*header, *_ints(kept), *_ints(routed)]
    mine = torch.tensor(values, dtype=torch.int64)
    p = runtime.get_world_size(group)
    if p == 1:
        return mine.unsqueeze(0)
    every = torch.empty(p * len(mine), dtype=torch.int64)
    collectives.all_gather_into_tensor(every, mine, group=group)
    return every.reshape(p, -1)


def _ints(counts) -> list:
    return counts.tolist() if isinstance(counts, torch.Tensor) else [int(n) for n in counts]


def _exchange(x: torch.Tensor, out_splits: list, in_splits: list, group) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    collectives.all_to_all_single(
        out, x, output_split_sizes=out_splits, input_split_sizes=in_splits, group=group
    )
    return out


class AllToAll(torch.autograd.Function):
    """Rows x[in_splits block q] go to rank q; this rank gets out_splits[q] rows from q."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _exchange(x.detach(), out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return _exchange(grad, in_splits, out_splits, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, out_splits: list, in_splits: list, group=None) -> torch.Tensor:
    """The uneven all-to-all of rows, differentiable (backward: the reverse exchange)."""
    if runtime.get_world_size(group) == 1:
        return x
    return AllToAll.apply(x, out_splits, in_splits, group)
