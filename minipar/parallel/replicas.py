"""Which ranks hold copies of a parameter: the mark the layers leave for the gradient norm.

    mark_replicated(layer.bias, tp_group)        # the same tensor on every rank of tp_group
    replicated_over(q)                           # (tp_group, dp_group, ...) as marked
    counted_here(groups)                         # True on the one rank that counts the copy
    pieces(q)                                    # [(start, stop, groups)] of q's numbers

The whole model's gradient norm is a sum over its numbers, each counted once. A rank's tensor
is either its own piece of the model (a tensor-parallel slice, an FSDP shard, a pipeline
stage's layer, its experts: unmarked, it counts here) or a copy of a tensor other ranks hold
too. The layer that makes a copy says so, naming the group it is copied over:

    RowParallelLinear's bias, LayerNorms, the position table   over tp (whole on every tp rank)
    every parameter DDP (or FSDP's replicated part) reduces     over the data-parallel group
    an MoE block's experts                                       over tp, and over the ranks
                                                                 that share them (expert_dp)
    the last stage's copy of a tied head                         over pp (stage 0 counts it)

A copy counts on the rank that is rank 0 of every group it is marked with: one rank of each
set of copies, because the groups are lines of one grid and a set of copies is the product of
its lines. An FSDP shard mixes pieces of several tensors (a LayerNorm beside a tp slice), so
it carries `replica_pieces`, one (start, stop, groups) per piece. Nothing moves here.
"""

from __future__ import annotations

from minipar import runtime

ATTRIBUTE = "replicated_over"  # a parameter's tuple of groups (absent: a piece of its own)
PIECES = "replica_pieces"  # a flat shard's [(start, stop, groups)], in the shard's numbers


def mark_replicated(params, group) -> None:
    """Mark each parameter of `params` (one, or an iterable) as copied over `group`; a group
    of one rank (or a group already marked) adds nothing."""
    if runtime.get_world_size(group) == 1:
        return
    for q in [params] if hasattr(params, "grad") else params:
        groups = getattr(q, ATTRIBUTE, ())
        if not any(g is group for g in groups):
            setattr(q, ATTRIBUTE, (*groups, group))


def replicated_over(q) -> tuple:
    """The groups `q` is copied over, as the layers marked them (() for a piece of its own)."""
    return getattr(q, ATTRIBUTE, ())


def counted_here(groups) -> bool:
    """Whether this rank counts a tensor copied over `groups`: it is rank 0 of every one."""
    return all(runtime.get_rank(g) == 0 for g in groups)


def pieces(q) -> list[tuple[int, int, tuple]]:
    """(start, stop, groups) for the runs of q's numbers (flattened): one for a plain tensor,
    one per original tensor for a flat shard that carries `replica_pieces`."""
    return getattr(q, PIECES, None) or [(0, q.numel(), replicated_over(q))]


def flat_pieces(layout, start: int, stop: int) -> list[tuple[int, int, tuple]]:
    """The pieces of the flat vector's numbers start .. stop (one rank's shard), from a layout
    of (offset, numel, groups) per tensor flattened into it, in the shard's own numbering;
    the padding after the last tensor belongs to no piece (its gradient is zero)."""
    out = []
    for offset, numel, groups in layout:
        lo, hi = max(offset, start), min(offset + numel, stop)
        if lo < hi:
            out.append((lo - start, hi - start, groups))
    return out
