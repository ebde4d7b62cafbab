"""A few data-parallel cases over minipar's torch.distributed transport (spawn + gloo)."""

import torch
from data_parallel import ddp_training, ddp_unused_on_some_ranks, fsdp_training, zero_with_ddp


def cases(size):
    return {
        "ddp_tied_adamw": ddp_training("tied", "adamw"),
        "ddp_unused_on_some_ranks": ddp_unused_on_some_ranks,
        "zero_with_ddp": zero_with_ddp,
        "fsdp_tied_bf16": fsdp_training("tied", "sgd", torch.bfloat16),
    }
