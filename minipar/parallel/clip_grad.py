"""clip_grad_norm_: the whole model's gradient norm from its pieces on every rank, and one clip
factor for all of them.

    norm = clip_grad_norm_(part.parameters(), 1.0, mesh=mesh)   # every rank of the mesh calls it

Roughly, for the 2-norm:

    local = sum of g^2 over the numbers this rank counts        (no communication)
    total = all_reduce(local, SUM) over the mesh's ranks        (two float64: the sum, a flag)
    norm  = sqrt(total);  every gradient *= min(1, max_norm / (norm + 1e-6))

A number counts on exactly one rank (replicas.py), by Megatron-LM's rule: a parameter nobody
marked is a copy over its tensor-parallel group and, its gradient reduced over dp (by DDP,
FSDP or by hand), over its dp x cp group, and counts on the rank that is rank 0 of both (a
plain torch.nn.LayerNorm beside the parallel layers is right with no mark). The pieces that
differ between ranks are marked by the layers that cut them: tensor-parallel slices, FSDP
shards, experts (sharded over ep, copied over expert_dp), pipeline stages; the last stage's copy
of a tied head is marked a copy over pp. Summing the counted numbers over all the mesh's ranks
then gives the dense model's sum, the number torch.nn.utils.clip_grad_norm_ returns on the dense
model (up to the order of the float sums); the all-reduce gives every rank the same bits, so
every rank computes the same norm and the same factor, and scales its own pieces by it.
Megatron-LM sums over its model-parallel group (tp x pp, after the dp reduction) and skips tp copies
by rank (clip_grads.py: a parameter without its `tensor_model_parallel` attribute counts only where
the tp rank is 0, `param_is_not_tensor_parallel_duplicate`); counting every copy once on one rank
makes a single reduction over the whole mesh enough, whatever the layout, FSDP's shards over dp
included (16 bytes, a few latency steps: nothing next to the gradients' own reduction). Marks that
leave a copy's ranks open (a shard over part of the dp line with no group for its copies) raise, on
every rank, saying what to mark: a silently wrong norm is the one outcome not allowed. The norm is
that of the gradients as they are: called before the dp reduction, it is the dp rank 0's local
gradient's.

Other norms as torch: p-norms sum |g|^p (one all-reduce, SUM); inf takes the largest |g| and
-inf the smallest (MAX, MIN); 0 is refused (torch's counts the tensors whose gradient
is not zero: a number that depends on the cut). A non-finite norm raises (the same error
on every rank) with error_if_nonfinite, else scales every gradient by NaN, as torch does.
Where the mistakes hide (the tests plant them): a copy counted on every rank of its group (the
norm too large by the copies), a stage's sum left out of the all-reduce (each stage its own
norm), the factor applied on some ranks only (the model no longer the dense one).
"""

from __future__ import annotations

import math

import torch

from minipar import collectives, runtime
from minipar.collectives.reduce_op import ReduceOp
from minipar.parallel import replicas

EPS = 1e-6  # torch's: the factor is max_norm / (norm + 1e-6)


def _check(max_norm, norm_type) -> float:
    for name, value in (("max_norm", max_norm), ("norm_type", norm_type)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {value!r}")
    norm_type = float(norm_type)
    if math.isnan(norm_type) or (norm_type <= 0 and norm_type != -math.inf):
        raise ValueError(
            f"norm_type must be > 0, inf or -inf, got {norm_type!r} (torch's 0-norm counts the "
            "tensors with a non-zero gradient: it depends on how the model is cut)"
        )
    return norm_type


def _local(grads, norm_type: float, resolver) -> torch.Tensor:
    """This rank's part of the reduction, a float64 scalar on the CPU: the sum of |g|^p (the
    largest / smallest |g| for +-inf) over the numbers it counts (`resolver` None: all of
    them, one process alone). One copy to the host at the end, not one per tensor (a GPU would
    wait for each)."""
    parts = []
    for g, spans in grads:
        flat = g.detach().reshape(-1)
        for start, stop, mark in spans:
            if start == stop:
                continue
            if resolver and not replicas.counted_here(resolver.counting_groups(mark, g.shape)):
                continue
            a = flat[start:stop].double().abs()
            if norm_type == math.inf:
                parts.append(a.max())
            elif norm_type == -math.inf:
                parts.append(a.min())
            else:
                parts.append(a.pow(norm_type).sum())
    if not parts:  # nothing counted here: the reduction's identity
        identity = math.inf if norm_type == -math.inf else 0.0
        return torch.tensor([identity], dtype=torch.float64)
    stacked = torch.stack(parts)
    if norm_type == math.inf:
        return stacked.max().reshape(1).cpu()
    if norm_type == -math.inf:
        return stacked.min().reshape(1).cpu()
    return stacked.sum().reshape(1).cpu()


def _reduce(t, problem, op, group) -> torch.Tensor:
    """The all-reduce of this rank's part with a flag beside it: a rank whose marks were
    ambiguous raises its error, and every other rank a pointer to it, instead of waiting."""
    bad, good = (0.0, 1.0) if op == ReduceOp.MIN else (1.0, 0.0)  # the op keeps a bad flag
    both = torch.cat([t, torch.tensor([bad if problem else good], dtype=torch.float64)])
    collectives.all_reduce(both, op, group=group)
    if problem is not None:
        raise problem
    if both[1].item() != good:
        raise replicas.AmbiguousCopies(
            "another rank of the mesh holds a parameter whose copies the gradient norm cannot "
            "tell (that rank's error names it and says what to mark)"
        )
    return both[:1]


def total_norm(parameters, norm_type: float = 2.0, mesh=None) -> torch.Tensor:
    """The whole model's gradient norm, the same bits on every rank of the mesh's group (None:
    the default group, or this process alone before minipar.init()), on the gradients' device,
    in their dtype (as torch returns it). Collective: one all-reduce of two float64 (16 bytes)
    on the host."""
    norm_type = _check(1.0, norm_type)
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    grads = [(q.grad, replicas.pieces(q)) for q in params if q.grad is not None]
    group = reduction_group(mesh)
    op = {math.inf: ReduceOp.MAX, -math.inf: ReduceOp.MIN}.get(norm_type, ReduceOp.SUM)
    if group is None and not runtime.is_initialized():  # one process, as torch's
        t = _local(grads, norm_type, None)
    else:
        resolver = replicas.Resolver(replicas.default_lines(mesh), mesh)
        try:
            t, problem = _local(grads, norm_type, resolver), None
        except replicas.AmbiguousCopies as error:
            t, problem = _local([], norm_type, None), error
        if runtime.get_world_size(group) > 1:
            t = _reduce(t, problem, op, group)
        elif problem is not None:
            raise problem
    if norm_type not in (math.inf, -math.inf):
        t = t.pow(1.0 / norm_type)
    like = grads[0][0] if grads else torch.zeros(())
    return t[0].to(like.device, like.dtype)


def reduction_group(mesh):
    """The ranks whose counted sums make up the model: all of the mesh's (None: default)."""
    return None if mesh is None else mesh.group


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, mesh=None, error_if_nonfinite=False):
    """Scale the gradients of `parameters` (this rank's) so that the whole model's gradient
    norm is at most `max_norm`; returns that norm before clipping, as torch does (in the
    gradients' dtype, the same bits on every rank). Every rank of `mesh` (None: of the default
    group) calls it, with the parameters it holds (a stage, a slice, a shard, its experts),
    marked by the layers that made them (replicas.py)."""
    _check(max_norm, norm_type)
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    norm = total_norm(params, norm_type, mesh)
    if error_if_nonfinite and not torch.isfinite(norm):
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the "
            "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"
        )
    factor = torch.clamp(max_norm / (norm + EPS), max=1.0)  # torch's arithmetic, its dtype
    for q in params:
        if q.grad is not None:
            q.grad.detach().mul_(factor.to(q.grad.device, q.grad.dtype))
    return norm
