"""Megatron's conjugate communication operators: autograd functions that move activations
forward and their gradients backward, each the other's transpose.

Tensor parallelism (Shoeybi et al. 2019, "Megatron-LM", section 3) wraps a column-parallel then a
row-parallel matrix product between two operators:

    f: identity forward,   all-reduce backward   (enters the parallel region: every rank needs
                                                  the whole input, and gets back a partial grad)
    g: all-reduce forward, identity backward     (leaves it: partial outputs are summed)

    x --f--> [X @ A_i  ->  GeLU  ->  @ B_i] --g--> y         (rank i holds A's columns, B's rows)

Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation") splits the
all-reduce into its two halves and keeps the activations between blocks sharded along the
sequence:

    g-bar: all-gather forward, reduce-scatter backward   (replaces f)
    g-bar's conjugate: reduce-scatter forward, all-gather backward   (replaces g)

Layout: activations are (batch, seq, ..., hidden); the tensor-parallel shards are slices of the
last dimension and the sequence-parallel shards slices of dimension 1, the sequence (Megatron
keeps (seq, batch, hidden) so its shards are dimension 0; we keep the dense twins' batch-first
layout and pay one transposing copy per gather or scatter instead). Rank r holds the r-th
contiguous slice.

Bytes per rank: an all-reduce of N bytes costs the ring 2 (p-1)/p N; an all-gather or a
reduce-scatter of an N-byte full tensor (p-1)/p N each: sequence parallelism moves the same bytes
as tensor parallelism's all-reduces, in twice as many, half-sized collectives.

All communication goes through minipar's own collectives with the group passed on; minipar
works in place on contiguous buffers, so every operator communicates a fresh contiguous copy and
never writes into a tensor autograd has saved.
"""

from __future__ import annotations

import torch

from minipar import collectives, runtime

SEQUENCE_DIM = 1  # activations are (batch, seq, ..., hidden)


def _fresh(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of x, safe to reduce in place."""
    return x.clone(memory_format=torch.contiguous_format)


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    """Sum x over the group (1 collective, ring: 2 (p-1)/p * x.nbytes bytes sent per rank)."""
    out = _fresh(x)
    if runtime.get_world_size(group) > 1:
        collectives.all_reduce(out, group=group)
    return out


def _split(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """This rank's contiguous slice of x along dim (no communication)."""
    p, r = runtime.get_world_size(group), runtime.get_rank(group)
    check_divisible(x.shape[dim], p, f"dimension {dim % x.dim()} of the input")
    return x.chunk(p, dim=dim)[r].contiguous()


def _gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Concatenate every rank's x along dim, in rank order (1 all-gather of p * x.nbytes)."""
    p = runtime.get_world_size(group)
    if p == 1:
        return _fresh(x)
    front = x.movedim(dim, 0).contiguous()  # minipar gathers flat blocks: put dim outermost
    out = front.new_empty((p * front.shape[0], *front.shape[1:]))
    collectives.all_gather_into_tensor(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def _reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Sum x over the group and keep this rank's slice along dim (1 reduce-scatter)."""
    p = runtime.get_world_size(group)
    if p == 1:
        return _fresh(x)
    check_divisible(x.shape[dim], p, f"dimension {dim % x.dim()} of the input")
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((front.shape[0] // p, *front.shape[1:]))
    collectives.reduce_scatter_tensor(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def check_divisible(size: int, p: int, what: str) -> None:
    """ValueError naming the dimension, its size and the group size (before any message)."""
    if size % p:
        raise ValueError(
            f"{what} has size {size}, which is not divisible by the tensor-parallel group size {p}"
        )


class _CopyToParallelRegion(torch.autograd.Function):
    """f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromParallelRegion(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToParallelRegion(torch.autograd.Function):
    """Keep this rank's slice of the last dimension forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, -1, ctx.group), None


class _GatherFromParallelRegion(torch.autograd.Function):
    """All-gather along the last dimension forward; keep this rank's slice backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, -1, ctx.group), None


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Keep this rank's slice of the sequence forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split(x, SEQUENCE_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, SEQUENCE_DIM, ctx.group), None


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """g-bar: all-gather the sequence forward; reduce-scatter the gradient backward (each rank's
    full-sequence gradient is a partial sum: it came through its own slice of the weights)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, SEQUENCE_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, SEQUENCE_DIM, ctx.group), None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """g-bar's conjugate: reduce-scatter along the sequence forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, SEQUENCE_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, SEQUENCE_DIM, ctx.group), None


def copy_to_tensor_parallel_region(x, group=None):
    """Megatron's f: identity forward, all-reduce backward."""
    return _CopyToParallelRegion.apply(x, group)


def reduce_from_tensor_parallel_region(x, group=None):
    """Megatron's g: all-reduce forward, identity backward."""
    return _ReduceFromParallelRegion.apply(x, group)


def scatter_to_tensor_parallel_region(x, group=None):
    """Split the last dimension (this rank's slice) forward; all-gather backward."""
    return _ScatterToParallelRegion.apply(x, group)


def gather_from_tensor_parallel_region(x, group=None):
    """All-gather the last dimension forward; split backward."""
    return _GatherFromParallelRegion.apply(x, group)


def scatter_to_sequence_parallel_region(x, group=None):
    """Split the sequence (dimension 1) forward; all-gather backward. Enters sequence-parallel
    activations from full ones (the embedding's output, a test's input)."""
    return _ScatterToSequenceParallelRegion.apply(x, group)


def gather_from_sequence_parallel_region(x, group=None):
    """All-gather the sequence forward; reduce-scatter backward (replaces f)."""
    return _GatherFromSequenceParallelRegion.apply(x, group)


def reduce_scatter_to_sequence_parallel_region(x, group=None):
    """Reduce-scatter along the sequence forward; all-gather backward (replaces g)."""
    return _ReduceScatterToSequenceParallelRegion.apply(x, group)


f = copy_to_tensor_parallel_region  # the papers' names
g = reduce_from_tensor_parallel_region
