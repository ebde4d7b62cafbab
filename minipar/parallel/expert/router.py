"""The router: which experts each token goes to, with what weight, and which copies fit.

    logits = x W_g^T                         (T, E): one linear layer, no bias
    probs  = softmax(logits)                 (T, E)
    experts, p = top-k of probs              (T, k): the k chosen experts of each token
    weights = p (k = 1, Switch) or p / sum(p) (k = 2, GShard, Mixtral)

Top-1 keeps the raw probability as the gate (Fedus et al. 2021, "Switch Transformers"): with a
weight renormalised to 1 the router would get no gradient from the output. Top-2 renormalises
over the two (Lepikhin et al. 2020, "GShard"; Jiang et al. 2024, "Mixtral").

Capacity (optional): each expert takes at most

    C = ceil(capacity_factor * k * T / E)          copies from one group of T tokens

(one group = one rank's tokens: each rank decides alone, before anything is sent). Copies
queue in GShard's order, every token's first choice before any second choice, each choice in
token order; the copies past C are dropped: they are not sent and add nothing to the output
(the residual connection around the layer carries the token on). `capacity_factor=None` is
dropless: every copy is kept, however uneven the load.

Load-balancing auxiliary loss (Switch, section 2.2; GShard's l_aux), per group:

    aux = E * sum_e f_e * P_e,   f_e = share of the T*k copies routed to e (before capacity),
                                 P_e = mean over the T tokens of probs[:, e]

f_e counts choices (no gradient); P_e carries the gradient. aux is 1 when both are uniform
and grows as the router piles tokens on a few experts; adding a small multiple of it to the
loss pushes the router back toward balance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class Routing:
    """One routing of T tokens (rows concatenated over its groups)."""

    experts: torch.Tensor  # (T, k) int64: the chosen experts of each token
    weights: torch.Tensor  # (T, k): the gates, differentiable
    kept: torch.Tensor  # (T, k) bool: the copy fits its expert's capacity
    routed: torch.Tensor  # (groups, E) int64: copies routed to each expert, before capacity
    fitted: torch.Tensor  # (groups, E) int64: the kept ones
    capacity: list  # per group: C, or None when dropless
    aux_loss: torch.Tensor  # scalar: the mean over groups of each group's aux


def capacity(capacity_factor, top_k: int, n_tokens: int, n_experts: int):
    """C = ceil(capacity_factor * k * T / E) copies per expert from T tokens; None: dropless."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * top_k * n_tokens / n_experts)


def keep_within_capacity(experts: torch.Tensor, n_experts: int, cap) -> torch.Tensor:
    """(T, k) bool: the copies that fit, queued first choices first, then in token order."""
    if cap is None:
        return torch.ones_like(experts, dtype=torch.bool)
    queue = experts.t().reshape(-1)  # (k*T,): all first choices, then all second choices
    one_hot = F.one_hot(queue, n_experts)
    place = (one_hot.cumsum(0) * one_hot).sum(1) - 1  # each copy's place in its expert's queue
    return (place < cap).reshape(experts.shape[1], -1).t()


def per_expert(experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """(E,) int64: how many of these copies chose each expert."""
    return torch.bincount(experts.reshape(-1), minlength=n_experts)


def aux_loss(probs: torch.Tensor, experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Switch's E * sum_e f_e P_e for one group (1 when balanced)."""
    if probs.shape[0] == 0:
        return probs.sum()  # 0, still attached to the graph
    f = per_expert(experts, n_experts).to(probs.dtype) / experts.numel()
    return n_experts * (f * probs.mean(0)).sum()


class Router(nn.Module):
    """Top-k softmax gating over `n_experts`; `gate.weight` is (n_experts, hidden)."""

    def __init__(self, hidden: int, n_experts: int, top_k: int = 2, capacity_factor=None):
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.gate = nn.Linear(hidden, n_experts, bias=False)

    def forward(self, x: torch.Tensor, group_sizes=None) -> Routing:
        """Route x (T, hidden). group_sizes: the tokens of each group (capacity and aux are per
        group; default one group of all T), as the rows of x in order."""
        sizes = list(group_sizes) if group_sizes is not None else [x.shape[0]]
        probs = F.softmax(self.gate(x), dim=-1)
        top, experts = probs.topk(self.top_k, dim=-1)
        weights = top / top.sum(-1, keepdim=True) if self.top_k > 1 else top
        kept, routed, fitted, caps, losses = [], [], [], [], []
        for p, e in zip(probs.split(sizes), experts.split(sizes)):
            cap = capacity(self.capacity_factor, self.top_k, p.shape[0], self.n_experts)
            kept.append(keep_within_capacity(e, self.n_experts, cap))
            routed.append(per_expert(e, self.n_experts))
            fitted.append(per_expert(e[kept[-1]], self.n_experts))
            caps.append(cap)
            losses.append(aux_loss(p, e, self.n_experts))
        return Routing(
            experts,
            weights,
            torch.cat(kept),
            torch.stack(routed),
            torch.stack(fitted),
            caps,
            torch.stack(losses).mean(),
        )

    def extra_repr(self) -> str:
        return (
            f"n_experts={self.n_experts}, top_k={self.top_k}, "
            f"capacity_factor={self.capacity_factor}"
        )
