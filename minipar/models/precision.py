"""The precision policy of a training run: what computes in which dtype, what stays fp32.

    --dtype fp32   everything float32
    --dtype bf16   matmuls in bfloat16 (torch.autocast: each weight cast on its way in), the
                   parameters themselves fp32 (the master weights), so are their gradients and
                   AdamW's moments; the loss (cross-entropy) on fp32 logits
    --dtype fp16   the same in float16, with dynamic loss scaling (parallel/loss_scale.py): fp16's
                   5 exponent bits flush small gradients to zero unless the loss is scaled up

The dense twin of --check runs the same policy, so both round at the same places. Gradients
are reduced in fp32; with --reduce-dtype bf16 DDP's buckets and FSDP's reduce-scatters move
bf16 (half the bytes on the wire, each gradient rounded to bf16 before the sum, the result
back in fp32), while the experts' and the tied head's small sums stay fp32.
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_of(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def autocast(name: str, device_type: str = "cpu"):
    """The context a forward runs in: torch.autocast to the dtype, or nothing for fp32."""
    if dtype_of(name) == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype_of(name))
