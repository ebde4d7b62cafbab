"""Sequence parallelism's one extra duty: replicated parameters that see only this rank's slice
of the sequence (a row-parallel layer's bias, the LayerNorms between blocks) get partial
gradients, which must be summed over the tensor-parallel group before the optimizer step.

Such parameters carry the attribute `sequence_parallel = True` (RowParallelLinear sets it on its
bias when sequence_parallel=True; `mark_sequence_parallel` sets it on a norm's parameters).
"""

from __future__ import annotations

import torch
from torch import nn

from minipar import collectives, runtime


def mark_sequence_parallel(module: nn.Module) -> nn.Module:
    """Mark every parameter of `module` (a LayerNorm between blocks) as sequence-parallel."""
    for q in module.parameters():
        q.sequence_parallel = True
    return module


def sync_sequence_parallel_grads(module: nn.Module, group=None) -> int:
    """All-reduce the gradients of `module`'s parameters marked `sequence_parallel = True`
    (replicated parameters applied to this rank's slice of the sequence: a row layer's bias,
    the norms between blocks), flattened into one buffer: one all-reduce of their total size.
    Returns the number of elements reduced. Call it after backward, before the optimizer."""
    grads = [
        q.grad
        for q in module.parameters()
        if getattr(q, "sequence_parallel", False) and q.grad is not None
    ]
    if not grads or runtime.get_world_size(group) == 1:
        return 0
    flat = torch.cat([x.reshape(-1) for x in grads])
    collectives.all_reduce(flat, group=group)
    offset = 0
    for x in grads:
        x.copy_(flat[offset : offset + x.numel()].view_as(x))
        offset += x.numel()
    return flat.numel()
