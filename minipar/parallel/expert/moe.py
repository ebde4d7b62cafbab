"""MoE: a mixture-of-experts feed-forward layer whose experts are spread over a group of ranks
(expert parallelism, GShard's layout: Lepikhin et al. 2020).

    MoE(hidden, ffn_hidden, n_experts, top_k=2, capacity_factor=None, group=None)
    moe = MoE.from_dense(dense_moe, group=ep_group)    # rank r: experts r*E/p .. (r+1)*E/p - 1

Roughly, one forward on rank r of p, T tokens of `hidden` features:

    route        router(x): k experts and gates per token; capacity drops (router.py)
    sort         the kept copies by expert: one block per destination rank (dispatch.py)
    counts       all-gather the copies per expert (and the input's shape): receive sizes
    dispatch     all-to-all: block q to rank q (own block copied, not sent)
    experts      regroup the rows by local expert; one FFN per expert (experts.py)
    combine      all-to-all back, the same blocks reversed; y_t = sum_j gate_tj * out_tj

    rank 0: x0 -route-> [e0 e1 | e2 e3] --a2a--> e0 e1 on x0's + x1's copies --a2a--> y0
    rank 1: x1 -route-> [e0 e1 | e2 e3] --a2a--> e2 e3 on x0's + x1's copies --a2a--> y1

Bytes per layer: each all-to-all sends, from every rank, its off-rank rows x hidden x dtype
size. Forward, rank r sends (its copies routed off-rank + the copies it processed for others)
x h x s, backward the same again (the all-to-alls reversed), plus the count all-gather, (p-1)
(3+2E) 8 bytes on the ring. With k = 2 and uniform routing, (p-1)/p of the 2T copies leave:
each all-to-all sends as much as a ring all-reduce of the (T, h) activations would, 2(p-1)/p T h
s (tensor parallelism's all-reduce of the same activations, lesson 06).

Gradients: backward runs the all-to-alls in reverse, so each expert's weights see the
gradients of every copy routed to them, from every rank: the owner's expert gradient is the
single-process gradient over all of the group's tokens, with no reduction. The router is
replicated: each rank's router gradient covers its own tokens, summed (or averaged) over the
ranks by data parallelism like any replicated parameter. When the data-parallel group is
larger than the expert-parallel one, groups.py says which ranks share an expert and reduces it.

`moe.aux_loss` (this rank's load-balancing loss) and `moe.last_stats` (the whole group's
load, stats.py) are set by each forward.
"""

from __future__ import annotations

import torch
from torch import nn

from minipar import collectives, runtime
from minipar.parallel import replicas
from minipar.parallel.expert import checks, dispatch, exchange
from minipar.parallel.expert.dense import DenseMoE
from minipar.parallel.expert.experts import Experts
from minipar.parallel.expert.router import Router, capacity
from minipar.parallel.expert.stats import from_counts


def gather_config(mine: dict, group) -> list:
    """Every rank's config (one all_gather_object; a single rank: just its own)."""
    p = runtime.get_world_size(group)
    if p == 1:
        return [mine]
    every = [None] * p
    collectives.all_gather_object(every, mine, group=group)
    return every


class MoE(nn.Module):
    """The expert-parallel layer on (..., hidden) inputs; see the module docstring."""

    def __init__(
        self,
        hidden: int,
        ffn_hidden: int,
        n_experts: int,
        top_k: int = 2,
        capacity_factor=None,
        group=None,
    ):
        super().__init__()
        mine = checks.config(n_experts, hidden, ffn_hidden, top_k, capacity_factor)
        checks.check_config(gather_config(mine, group))  # the same error on every rank
        self.hidden, self.ffn_hidden, self.n_experts = hidden, ffn_hidden, n_experts
        self.top_k, self.capacity_factor, self.group = top_k, capacity_factor, group
        self.ep, rank = runtime.get_world_size(group), runtime.get_rank(group)
        self.n_local = n_experts // self.ep
        self.first = rank * self.n_local  # this rank's experts: first .. first + n_local - 1
        self.router = Router(hidden, n_experts, top_k, capacity_factor)
        self.experts = Experts(self.n_local, hidden, ffn_hidden)
        replicas.mark_sharded(self.experts.parameters(), group)  # each rank its own experts
        if self.ep > 1:  # the router is replicated: start every rank from group rank 0's
            collectives.broadcast(self.router.gate.weight.data, src=0, group=group)
        self.aux_loss, self.last_stats = None, None

    @classmethod
    def from_dense(cls, dense, group=None) -> MoE:
        """The router of a DenseMoE and this rank's contiguous slice of its experts."""
        if not isinstance(dense, DenseMoE):
            raise TypeError(f"MoE.from_dense takes a DenseMoE, got {type(dense).__name__}")
        moe = cls(
            dense.hidden,
            dense.ffn_hidden,
            dense.n_experts,
            dense.top_k,
            dense.capacity_factor,
            group,
        )
        gate = dense.router.gate.weight
        moe.to(device=gate.device, dtype=gate.dtype)  # where the dense model lives, its dtype
        with torch.no_grad():
            moe.router.gate.weight.copy_(gate)
        moe.experts = dense.experts.shard(moe.first, moe.n_local)
        replicas.mark_sharded(moe.experts.parameters(), group)
        return moe

    @property
    def dtype(self):
        return self.router.gate.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ok = x.dim() >= 1 and x.shape[-1] == self.hidden and x.dtype == self.dtype
        kept = routed = [0] * self.n_experts  # a wrong input is said in the count exchange:
        if ok:  # every rank raises on it there, and no token is sent
            flat = x.reshape(-1, self.hidden)
            routing = self.router(flat)
            plan = dispatch.plan(routing.experts, routing.kept, self.n_experts, self.ep)
            kept, routed = routing.fitted[0], routing.routed[0]
        rows = exchange.exchange_counts(exchange.header(x), kept, routed, self.group)
        checks.check_inputs(rows, self.hidden, self.dtype)
        self.last_stats = self._stats(rows)
        width = len(exchange.HEADER)
        per_source = rows[:, width + self.first : width + self.first + self.n_local]
        mine = self._local_experts(flat[plan.tokens], plan.splits, per_source)
        self.aux_loss = routing.aux_loss
        return dispatch.combine(mine, plan, routing.weights).reshape(x.shape)

    def _local_experts(self, sent, splits, per_source) -> torch.Tensor:
        """Dispatch, this rank's experts, combine: rows in the plan's order, in and out."""
        received_splits = per_source.sum(1).tolist()
        received = exchange.all_to_all(sent, received_splits, splits, self.group)
        perm, per_expert = dispatch.regroup(per_source)
        perm = perm.to(received.device)
        out = self.experts(received[perm], per_expert.tolist())
        back = out[dispatch.inverse_permutation(perm)]  # by source again, as they came
        return exchange.all_to_all(back, splits, received_splits, self.group)

    def _stats(self, rows):
        width, e = len(exchange.HEADER), self.n_experts
        tokens = rows[:, 2].tolist()
        caps = [capacity(self.capacity_factor, self.top_k, t, e) for t in tokens]
        kept, routed = rows[:, width : width + e], rows[:, width + e :]
        return from_counts(tokens, routed.tolist(), kept.tolist(), caps, self.top_k)

    def extra_repr(self) -> str:
        return (
            f"hidden={self.hidden}, ffn_hidden={self.ffn_hidden}, n_experts={self.n_experts} "
            f"(this rank: {self.first}..{self.first + self.n_local - 1}), top_k={self.top_k}, "
            f"capacity_factor={self.capacity_factor}, ep={self.ep}"
        )
