"""Cross-entropy over logits split by vocabulary, without ever gathering the full logits.

Rank r holds logits[..., r*V/p:(r+1)*V/p] (a column-parallel output layer's output). For each
token, with z its logits and t its target:

    loss = log(sum_v exp(z_v - m)) - (z_t - m),      m = max_v z_v

Three quantities span the vocabulary, and each is one all-reduce of one number per token:
the max m (MAX), then the sum of exponentials and the target's logit (SUM; only the rank that
owns t contributes it; both travel in one buffer). So 2 all-reduces of 1 and 2 values per token
instead of an all-gather of V values per token. The gradient is local:

    dloss/dz_v = softmax(z)_v - [v == t]

each rank computing its own slice from the saved softmax, with no communication backward.

A padded vocabulary (plan.py's vocab cut: V real classes in Vp columns, the padding at the end)
needs nothing more when the logits come from VocabParallelHead, whose padded columns are -inf
already: exp(-inf) = 0, so they add nothing to the sum and their gradient is 0. Logits from
elsewhere pass `vocab_size=V` and columns V..Vp-1 are set to -inf here.
"""

from __future__ import annotations

import torch

from minipar import collectives, runtime
from minipar.collectives.reduce_op import ReduceOp


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group, vocab_size):
        local_vocab = logits.shape[-1]
        start = runtime.get_rank(group) * local_vocab
        many = runtime.get_world_size(group) > 1
        logits = logits.float()
        if vocab_size is not None and start + local_vocab > vocab_size:  # padding here
            padding = torch.arange(start, start + local_vocab, device=logits.device) >= vocab_size
            logits = logits.masked_fill(padding, float("-inf"))
        m = logits.amax(dim=-1).contiguous()  # the row's largest logit, this rank's part
        if many:
            collectives.all_reduce(m, op=ReduceOp.MAX, group=group)
        shifted = logits - m.unsqueeze(-1)
        outside = (target < start) | (target >= start + local_vocab)
        local = (target - start).masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0)
        exp = shifted.exp()
        sums = torch.stack([exp.sum(dim=-1), target_logit])  # (2, ...): one all-reduce
        if many:
            collectives.all_reduce(sums, group=group)
        sum_exp, target_logit = sums
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local, outside)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local, outside = ctx.saved_tensors
        grad = softmax.clone()
        # subtract 1 at the target, on the rank that owns it
        hit = grad.gather(-1, local.unsqueeze(-1)) - (~outside).unsqueeze(-1).to(grad.dtype)
        grad.scatter_(-1, local.unsqueeze(-1), hit)
        return grad * grad_loss.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    group=None,
    reduction: str = "mean",
    vocab_size: int | None = None,
) -> torch.Tensor:
    """Cross-entropy of `logits` (..., V/p), this rank's vocabulary slice, against `target`
    (...) of global ids in [0, V). reduction: "mean", "sum" or "none" (per token). Every rank
    gets the same loss. vocab_size: the real vocabulary when the p slices hold more columns
    (padding, excluded); None: every column is a class."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    columns = logits.shape[-1] * runtime.get_world_size(group)
    if vocab_size is not None and (
        isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
        or not 0 < vocab_size <= columns
    ):  # fmt: skip
        raise ValueError(
            f"vocab_size must be an int in 1..{columns} (the logits' columns on all ranks), "
            f"got {vocab_size!r}"
        )
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"target has shape {tuple(target.shape)} but logits {tuple(logits.shape)} need "
            f"target of shape {tuple(logits.shape[:-1])}"
        )
    if target.dtype.is_floating_point:
        raise ValueError(f"target must hold integer class ids, got dtype {target.dtype}")
    loss = _VocabParallelCrossEntropy.apply(logits, target, group, vocab_size)
    if reduction == "mean":
        return loss.mean()
    return loss.sum() if reduction == "sum" else loss
