"""The training state a rank keeps, in bytes per parameter: lesson 01's table, measured.

    row = state_bytes(part.parameters(), opt)     # after a step: {"weights": 4.0, "grads": 4.0,
                                                  #  "master": 0.0, "m": 4.0, "v": 4.0, ...}

Lesson 01 counts 16 bytes per parameter for mixed-precision Adam: bf16 weights 2, bf16
gradients 2, an fp32 master copy 4, fp32 moments m and v 4 + 4. minipar's bf16 policy
(models/precision.py) keeps the same 16 in another split: the parameters themselves are the
fp32 master weights (4, and no separate copy: 0), their gradients fp32 (4), m and v fp32
(4 + 4); the bf16 weights exist only while a forward runs (autocast casts each matmul weight
once per forward and keeps the copy until the forward ends: `compute_copies`, 2 bytes per matmul
weight, counted apart because it is transient). fp32 runs hold the same 16.

Counted over the numbers this rank holds (`held`: a tp slice, a stage, an FSDP shard), so a
strategy that shards divides the rank's total, not this figure: ZeRO-1 divides m and v by its
group's size, FSDP all four (lesson 05's formulas).
"""

from __future__ import annotations

import torch


def state_bytes(params, opt, compute_dtype=torch.float32) -> dict:
    """Bytes per held parameter on this rank: weights, grads, master (a separate copy: none
    here), m, v (ZeRO-1: of the parameters this rank owns), compute_copies (transient, from
    autocast), total (without the transient copies), and `held`, the parameters counted."""
    params = list(params)
    held = sum(q.numel() for q in params) or 1
    weights = sum(q.numel() * q.element_size() for q in params)
    grads = sum(q.grad.numel() * q.grad.element_size() for q in params if q.grad is not None)
    m = v = 0
    states = getattr(opt, "optim", None) or opt  # ZeRO-1: the wrapped optimizer of its shard
    states = states.state if states is not None else {}
    for q in params:
        st = states.get(q, {})
        m += st["exp_avg"].numel() * st["exp_avg"].element_size() if "exp_avg" in st else 0
        v += st["exp_avg_sq"].numel() * st["exp_avg_sq"].element_size() if "exp_avg_sq" in st else 0
    matrices = sum(q.numel() for q in params if q.dim() >= 2)  # what autocast casts (matmuls)
    copies = matrices * compute_dtype.itemsize if compute_dtype != torch.float32 else 0
    row = {"weights": weights, "grads": grads, "master": 0, "m": m, "v": v}
    out = {k: b / held for k, b in row.items()}
    out["total"] = sum(out.values())
    out["compute_copies"] = copies / held
    out["held"] = held
    return out
