"""The dispatch: this rank's token copies put in the order the all-to-all sends them, and back.

Every token has k copies (copy c = token * k + j, its j-th choice). Sorted by expert (stably,
dropped copies last), the kept copies form one block per expert, and since rank q owns the
contiguous experts q*E/p .. (q+1)*E/p - 1, one block per destination rank:

    copies (T=4, k=2):   t0->e2 t0->e0 | t1->e1 t1->e3 | t2->e0 t2->e1 | t3->e3 t3->e2
    sorted by expert:    e0: t0 t2 | e1: t1 t2 | e2: t0 t3 | e3: t1 t3
    counts (E=4):        [2, 2, 2, 2]
    split sizes (p=2):   rank 0 gets e0+e1 = 4 rows, rank 1 gets e2+e3 = 4 rows

`order` is that sort (a permutation of the T*k copies); `inverse` undoes it (inverse[order[i]]
= i), so outputs that come back in sorted order are put back at their copies' places with one
gather, and the backward of that gather is a gather by `order`. Nothing here communicates: it
is the local half of the exchange (exchange.py moves the rows).

On the receiving rank the rows arrive by source (rank 0's block, then rank 1's, ...), each
block sorted by expert; `regroup` orders them by expert, then source, so that each local expert
gets one contiguous batch, in the same order a single process would give it (source rank
first, then token order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Plan:
    order: torch.Tensor  # (T*k,) int64: copies sorted by expert, dropped copies last
    counts: torch.Tensor  # (E,) int64: kept copies per expert
    splits: list  # rows for each destination rank: sums of counts over its experts
    inverse: torch.Tensor  # (T*k,) int64: inverse[order[i]] = i
    tokens: torch.Tensor  # (kept,) int64: the token of each kept copy, in sorted order

    @property
    def kept(self) -> int:
        return len(self.tokens)


def sort_by_expert(experts: torch.Tensor, kept: torch.Tensor, n_experts: int):
    """(order, counts): the (T, k) copies sorted stably by expert, dropped ones (key E) last,
    and the kept copies per expert."""
    # BEGIN ANSWER ex10_moe_dispatch
    key = torch.where(kept, experts, n_experts).reshape(-1)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=n_experts + 1)[:n_experts]
    return order, counts
    # END ANSWER


def split_sizes(counts: torch.Tensor, n_ranks: int) -> list:
    """Rows for each rank: rank q owns experts q*E/p .. (q+1)*E/p - 1, contiguous."""
    # BEGIN ANSWER ex10_moe_dispatch
    return counts.reshape(n_ranks, -1).sum(1).tolist()
    # END ANSWER


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """inverse[order[i]] = i."""
    # BEGIN ANSWER ex10_moe_dispatch
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return inverse
    # END ANSWER


def plan(experts: torch.Tensor, kept: torch.Tensor, n_experts: int, n_ranks: int) -> Plan:
    order, counts = sort_by_expert(experts, kept, n_experts)
    n_kept = int(counts.sum())
    tokens = order[:n_kept] // experts.shape[1]
    return Plan(order, counts, split_sizes(counts, n_ranks), inverse_permutation(order), tokens)


def combine(rows: torch.Tensor, plan: Plan, weights: torch.Tensor) -> torch.Tensor:
    """y_t = sum_j weights[t, j] * (expert output of copy (t, j), 0 if dropped): rows (kept, h)
    in sorted order -> (T, h)."""
    (t, k), h = weights.shape, rows.shape[1]
    dropped = rows.new_zeros((t * k - plan.kept, h))
    copies = torch.cat([rows, dropped])[plan.inverse].reshape(t, k, h)
    return (weights.unsqueeze(-1).to(copies.dtype) * copies).sum(1)


def regroup(per_source: torch.Tensor):
    """(perm, per_expert) for rows received by source: per_source (p, E_local) counts rows of
    source q for local expert e; rows[perm] is by expert then source; per_expert (E_local,)."""
    p, n_local = per_source.shape
    starts = per_source.reshape(-1).cumsum(0) - per_source.reshape(-1)  # block (q, e) starts
    starts, sizes = starts.reshape(p, n_local).t().reshape(-1), per_source.t().reshape(-1)
    pieces = [torch.arange(s, s + n) for s, n in zip(starts.tolist(), sizes.tolist())]
    perm = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
    return perm, per_source.sum(0)
