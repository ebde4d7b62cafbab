"""The dense (single-device) twins of the tensor-parallel MLP and self-attention.

They fix the weight layout that the parallel layers slice, torch's own: `nn.Linear.weight` is
(out_features, in_features). In `DenseSelfAttention.qkv` the output rows are [q; k; v], each
`hidden_size` rows, and inside each the heads are contiguous (head h owns rows
h*head_dim:(h+1)*head_dim), so splitting the heads across t ranks gives each rank a contiguous
block of q, of k and of v.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class DenseMLP(nn.Module):
    """fc1 (hidden -> ffn), GELU, fc2 (ffn -> hidden), on inputs of shape (..., hidden)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, ffn_hidden_size, bias=bias)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn_hidden_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal scaled dot-product attention on (batch, heads, seq, head_dim) tensors, written out:
    scores q k^T / sqrt(head_dim), -inf above the diagonal, softmax over each row, times v.

    What autograd keeps for backward: q, k and v (views of the qkv projection's output) and the
    softmax's (batch, heads, seq, seq) output, a s^2 b values for a heads: the term of
    Korthikanti et al.'s activation formula that selective recomputation drops
    (minipar/parallel/recompute.py). torch's fused scaled_dot_product_attention computes the
    same thing without ever storing the s x s matrix (FlashAttention recomputes it, block by
    block, in backward: selective recomputation inside one kernel); written out, the trade
    can be seen and measured."""
    s = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (b, a, s, s)
    above = torch.full((s, s), float("-inf"), dtype=scores.dtype, device=scores.device).triu(1)
    return (scores + above).softmax(dim=-1) @ v  # adding a constant keeps nothing for backward


class AttentionCore(nn.Module):
    """causal_attention as a module (no parameters): the part of attention between the qkv and
    the output projections, the unit that selective recomputation recomputes."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return causal_attention(q, k, v)


class DenseSelfAttention(nn.Module):
    """Causal multi-head self-attention on (batch, seq, hidden): qkv projection, attention per
    head, output projection `proj`."""

    def __init__(self, hidden_size: int, num_heads: int, bias: bool = True):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.head_dim = hidden_size // num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=bias)
        self.core = AttentionCore()
        self.proj = nn.Linear(hidden_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(self.hidden_size, dim=-1)
        q, k, v = (t.view(b, s, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        out = self.core(q, k, v).transpose(1, 2).reshape(b, s, self.hidden_size)
        return self.proj(out)
