"""Which ranks exchange tokens and which share an expert, when ep < dp.

Practice (GShard, Megatron-LM's expert-model-parallel groups) shards the experts over the
data-parallel ranks: dp ranks split into dp/ep expert-parallel groups of ep consecutive ranks,
each holding all E experts between them; the ranks at the same position of every such group
hold the same experts (an expert-data-parallel group of dp/ep ranks).

    dp = 4, ep = 2, E = 4      expert-parallel groups (tokens travel inside): [0 1] [2 3]
                               expert-data-parallel groups (same experts):    [0 2] [1 3]
    rank:     0        1        2        3
    experts:  e0 e1    e2 e3    e0 e1    e2 e3

Non-expert parameters (attention, norms, the router) are replicated on all dp ranks and
reduced over dp by DDP. An expert's gradient on one rank already covers every token of its
expert-parallel group (the all-to-alls brought them); the dp/ep copies of it covered different
tokens, so they are summed over the expert-data-parallel group, then divided as DDP divides:
with DDP averaging over dp (each rank's loss a mean over its own tokens), divide_by = dp. With
ep = dp the group is one rank and only the division is left. The ranks here are positions
0 .. dp-1 in the data-parallel group; the mesh maps them to global ranks.
"""

from __future__ import annotations

import torch

from minipar import collectives, runtime


def _check(dp: int, ep: int) -> None:
    if not (isinstance(dp, int) and isinstance(ep, int) and dp >= 1 and ep >= 1 and dp % ep == 0):
        raise ValueError(f"ep={ep!r} must be a positive int that divides dp={dp!r}")


def expert_parallel_ranks(dp: int, ep: int) -> list:
    """The dp/ep groups of ep consecutive ranks that exchange tokens."""
    _check(dp, ep)
    return [[g * ep + s for s in range(ep)] for g in range(dp // ep)]


def expert_data_parallel_ranks(dp: int, ep: int) -> list:
    """The ep groups of dp/ep ranks holding the same experts (position s of every ep group)."""
    _check(dp, ep)
    return [[g * ep + s for g in range(dp // ep)] for s in range(ep)]


def ranks_sharing_expert(expert: int, n_experts: int, dp: int, ep: int) -> list:
    """The ranks that hold expert `expert` (and reduce its gradient together)."""
    _check(dp, ep)
    if n_experts % ep or not 0 <= expert < n_experts:
        raise ValueError(f"expert {expert} of n_experts={n_experts} does not shard over ep={ep}")
    return expert_data_parallel_ranks(dp, ep)[expert // (n_experts // ep)]


def expert_parameters(module) -> list:
    return [q for q in module.parameters() if getattr(q, "expert_parallel", False)]


def sync_expert_grads(module, group=None, divide_by: float = 1.0) -> None:
    """Sum the gradients of `module`'s expert parameters over `group` (the ranks sharing these
    experts), then divide them by `divide_by`: one all-reduce of all of them, flattened."""
    params = [q for q in expert_parameters(module) if q.grad is not None]
    if not params:
        return
    flat = torch.cat([q.grad.reshape(-1) for q in params])
    if runtime.get_world_size(group) > 1:
        collectives.all_reduce(flat, group=group)
    if divide_by != 1:
        flat /= divide_by
    for q, g in zip(params, flat.split([q.numel() for q in params])):
        q.grad.copy_(g.view_as(q.grad))
