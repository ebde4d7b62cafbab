"""ParallelSelfAttention: causal multi-head attention with the heads split across a group.

Heads are independent, so rank r runs heads r*n/p:(r+1)*n/p end to end: a column-parallel qkv
projection (this rank's rows of q, of k and of v: DenseSelfAttention keeps the heads contiguous
inside each), attention on its own heads with no communication, and a row-parallel output
projection `proj` whose partial outputs g all-reduces.

    x --f--> qkv (3h/p rows) -> attention on n/p heads -> proj (h/p columns) --g--> y

Communication per call: one all-reduce of the (batch, seq, hidden) output forward, one of the
input's gradient backward, b*s*h elements each (sequence parallel: an all-gather and a
reduce-scatter each way instead, the same bytes).
"""

from __future__ import annotations

import torch
from torch import nn

from minipar.parallel.tensor import operators as ops
from minipar.parallel.tensor import plan
from minipar.parallel.tensor.dense import AttentionCore, DenseSelfAttention
from minipar.parallel.tensor.linear import (
    ColumnParallelLinear,
    RowParallelLinear,
    group_size_and_rank,
)


class ParallelSelfAttention(nn.Module):
    """The tensor-parallel twin of DenseSelfAttention (same attribute names: qkv, proj)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        bias: bool = True,
        group=None,
        sequence_parallel: bool = False,
    ):
        super().__init__()
        p, _ = group_size_and_rank(group)
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
        ops.check_divisible(num_heads, p, "num_heads")
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.head_dim, self.local_heads = hidden_size // num_heads, num_heads // p
        self.qkv = ColumnParallelLinear(
            hidden_size, 3 * hidden_size, bias, group=group, sequence_parallel=sequence_parallel
        )
        self.core = AttentionCore()  # causal attention on this rank's heads
        self.proj = RowParallelLinear(
            hidden_size, hidden_size, bias, group=group, sequence_parallel=sequence_parallel
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # (b, s, 3 * local_heads * head_dim), the full sequence
        b, s, _ = qkv.shape
        q, k, v = qkv.split(self.local_heads * self.head_dim, dim=-1)
        q, k, v = (t.view(b, s, self.local_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        out = self.attend(q, k, v).transpose(1, 2).reshape(b, s, -1)
        return self.proj(out)

    def attend(self, q, k, v):
        """Causal attention of this rank's heads, (b, local_heads, s, head_dim) each; context
        parallelism overrides it (minipar.parallel.context.attention)."""
        return self.core(q, k, v)

    @classmethod
    def from_dense(cls, dense: DenseSelfAttention, group=None, sequence_parallel: bool = False):
        """This rank's heads of a DenseSelfAttention: its rows of q, k and v in qkv, its columns
        of proj (and proj's full bias)."""
        if not isinstance(dense, DenseSelfAttention):
            raise TypeError(
                f"{cls.__name__}.from_dense takes a DenseSelfAttention, got {type(dense)}"
            )
        bias = dense.qkv.bias is not None
        layer = cls(dense.hidden_size, dense.num_heads, bias, group, sequence_parallel)
        p, r = group_size_and_rank(group)
        plan.load_(layer.qkv, "qkv", dense.qkv, r, p)  # q, k and v each cut by heads
        plan.load_(layer.proj, RowParallelLinear.style, dense.proj, r, p)
        return layer
