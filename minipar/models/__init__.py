"""Models to train with minipar: a tiny GPT, its training text and its checkpoints.

    from minipar.models import GPTConfig, build_gpt, lm_loss
    from minipar.models.data import load_tokens, Batches
    from minipar.models import checkpoint

config.py is the run as plain data (model shape, layout), gpt.py the dense model (the reference
every parallel layout must match), parallel_gpt.py its tensor-parallel pipeline stages,
mesh_model.py one rank's share of it on a DeviceMesh (MeshGPT), sharding.py and fsdp_state.py
how dense tensors are cut and gathered back, data.py the shipped text and byte tokenizer,
checkpoint.py save/load of the dense weights, training.py the training loops. Importing this
package imports torch.
"""

from __future__ import annotations

from minipar.models import (
    checkpoint,
    config,
    data,
    fsdp_state,
    gpt,
    mesh_model,
    parallel_gpt,
    sharding,
    training,
)
from minipar.models.config import GPTConfig, RunSpec
from minipar.models.gpt import GPT, Block, Embedding, Head, build_gpt, lm_loss
from minipar.models.mesh_model import MeshGPT

__all__ = [
    "GPT",
    "Block",
    "Embedding",
    "GPTConfig",
    "Head",
    "MeshGPT",
    "RunSpec",
    "build_gpt",
    "checkpoint",
    "config",
    "data",
    "fsdp_state",
    "gpt",
    "lm_loss",
    "mesh_model",
    "parallel_gpt",
    "sharding",
    "training",
]
