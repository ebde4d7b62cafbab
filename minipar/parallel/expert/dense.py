"""DenseMoE: the single-process twin of MoE, every expert local, the same router and the same
arithmetic in the same order; `MoE.from_dense` slices it, and every check compares against it.

    dense = DenseMoE(hidden, ffn_hidden, n_experts, top_k=2, capacity_factor=None)
    y = dense(x, groups=p)      # x: every rank's tokens, rank 0's first

`groups` splits the tokens into the groups that MoE's ranks are (p equal groups, or a list of
sizes, in rank order): capacity and the auxiliary loss are per group there (each rank routes
its own tokens), so they are per group here. With one group it is an ordinary MoE layer.
`aux_loss` is then the mean of the groups' losses, and `last_stats` has one row per group.
"""

from __future__ import annotations

import torch
from torch import nn

from minipar.parallel.expert import checks, dispatch
from minipar.parallel.expert.experts import Experts
from minipar.parallel.expert.router import Router
from minipar.parallel.expert.stats import from_counts


def group_sizes(groups, n_tokens: int) -> list:
    """groups: an int (equal groups) or a list of sizes; ValueError if they do not fit."""
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 1 or n_tokens % groups:
            raise ValueError(f"DenseMoE: {n_tokens} tokens do not split into groups={groups}")
        return [n_tokens // groups] * groups
    sizes = list(groups)
    if sum(sizes) != n_tokens or any(n < 0 for n in sizes):
        raise ValueError(f"DenseMoE: group sizes {sizes} do not add up to {n_tokens} tokens")
    return sizes


class DenseMoE(nn.Module):
    def __init__(
        self, hidden: int, ffn_hidden: int, n_experts: int, top_k: int = 2, capacity_factor=None
    ):
        super().__init__()
        mine = checks.config(n_experts, hidden, ffn_hidden, top_k, capacity_factor)
        checks.check_config([mine], "DenseMoE")
        self.hidden, self.ffn_hidden, self.n_experts = hidden, ffn_hidden, n_experts
        self.top_k, self.capacity_factor = top_k, capacity_factor
        self.router = Router(hidden, n_experts, top_k, capacity_factor)
        self.experts = Experts(n_experts, hidden, ffn_hidden)
        self.aux_loss, self.last_stats = None, None

    def forward(self, x: torch.Tensor, groups=1) -> torch.Tensor:
        if x.dim() < 1 or x.shape[-1] != self.hidden:
            raise ValueError(
                f"DenseMoE: the input's last dimension must be hidden={self.hidden}, "
                f"got shape {tuple(x.shape)}"
            )
        flat = x.reshape(-1, self.hidden)
        sizes = group_sizes(groups, flat.shape[0])
        routing = self.router(flat, sizes)
        plan = dispatch.plan(routing.experts, routing.kept, self.n_experts, 1)
        out = self.experts(flat[plan.tokens], plan.counts.tolist())
        self.aux_loss = routing.aux_loss
        self.last_stats = from_counts(
            sizes, routing.routed.tolist(), routing.fitted.tolist(), routing.capacity, self.top_k
        )
        return dispatch.combine(out, plan, routing.weights).reshape(x.shape)

    def extra_repr(self) -> str:
        return (
            f"hidden={self.hidden}, ffn_hidden={self.ffn_hidden}, n_experts={self.n_experts}, "
            f"top_k={self.top_k}, capacity_factor={self.capacity_factor}"
        )
