"""The experts: n independent feed-forward networks, stored as one batch of weights.

    expert e:  y = W2[e] GELU(W1[e] x + b1[e]) + b2[e]      (DenseMLP's shape, once per expert)

    w1 (n, ffn, hidden)   b1 (n, ffn)   w2 (n, hidden, ffn)   b2 (n, hidden)

Stacking keeps expert e's weights at index e of every tensor, so the expert-parallel layer on
rank r holds rows r*E/p .. (r+1)*E/p of each (`shard`). The forward takes rows already grouped by
expert (counts[e] rows for expert e, in order) and runs one small matrix product per local
expert; production kernels fuse the loop ("grouped GEMM", as in MegaBlocks, Gale et al. 2022),
with the same arithmetic.

Every parameter carries `expert_parallel = True`: its gradient comes from the tokens the owner
received, not from this rank's tokens only, so data parallelism must not average it with the
other ranks' (groups.py says over which ranks it is reduced instead).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class Experts(nn.Module):
    def __init__(self, n_experts: int, hidden: int, ffn_hidden: int):
        super().__init__()
        self.n_experts, self.hidden, self.ffn_hidden = n_experts, hidden, ffn_hidden
        self.w1 = nn.Parameter(torch.empty(n_experts, ffn_hidden, hidden))
        self.b1 = nn.Parameter(torch.empty(n_experts, ffn_hidden))
        self.w2 = nn.Parameter(torch.empty(n_experts, hidden, ffn_hidden))
        self.b2 = nn.Parameter(torch.empty(n_experts, hidden))
        for w, b, fan_in in ((self.w1, self.b1, hidden), (self.w2, self.b2, ffn_hidden)):
            bound = 1 / math.sqrt(fan_in)  # nn.Linear's default, per expert
            nn.init.uniform_(w, -bound, bound)
            nn.init.uniform_(b, -bound, bound)
        for q in self.parameters():
            q.expert_parallel = True

    def forward(self, rows: torch.Tensor, counts) -> torch.Tensor:
        """rows (sum(counts), hidden), expert e's counts[e] rows contiguous -> the same shape."""
        outs = []
        # unbind, not w1[e]: indexing's backward writes a zero tensor of all n experts per
        # index, n^2 work; unbind's stacks the n gradients once
        weights = zip(*(q.unbind(0) for q in (self.w1, self.b1, self.w2, self.b2)))
        for x, (w1, b1, w2, b2) in zip(rows.split([int(n) for n in counts]), weights):
            outs.append(F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2))
        return torch.cat(outs) if outs else rows

    def shard(self, first: int, n: int) -> Experts:
        """A new Experts holding copies of experts first .. first+n-1."""
        part = Experts(n, self.hidden, self.ffn_hidden).to(self.w1.device, self.w1.dtype)
        with torch.no_grad():
            for mine, full in zip(part.parameters(), self.parameters()):
                mine.copy_(full[first : first + n])
        return part

    def extra_repr(self) -> str:
        return f"n_experts={self.n_experts}, hidden={self.hidden}, ffn_hidden={self.ffn_hidden}"
