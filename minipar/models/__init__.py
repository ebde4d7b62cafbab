"""Models to train with minipar: a tiny GPT, its training text and its checkpoints.

    from minipar.models import GPTConfig, build_gpt, lm_loss
    from minipar.models.data import load_tokens, Batches
    from minipar.models import checkpoint

config.py is the run as plain data (model shape, layout), gpt.py the dense model (the reference
every parallel layout must match), parallel_gpt.py its tensor-parallel pipeline stages,
mesh_model.py one rank's share of it on a DeviceMesh (MeshGPT), sharding.py and fsdp_state.py
how dense tensors are cut and gathered back, data.py the shipped text and byte tokenizer,
checkpoint.py save/load of the dense weights, training.py the training loops. Importing this
package is light: torch loads with the first name that needs it.
"""

from __future__ import annotations

from minipar import lazy

_LAZY = {
    "GPTConfig": "minipar.models.config",
    "RunSpec": "minipar.models.config",
    "GPT": "minipar.models.gpt",
    "Block": "minipar.models.gpt",
    "Embedding": "minipar.models.gpt",
    "Head": "minipar.models.gpt",
    "build_gpt": "minipar.models.gpt",
    "lm_loss": "minipar.models.gpt",
    "MeshGPT": "minipar.models.mesh_model",
}
_SUBMODULES = {
    "checkpoint",
    "config",
    "data",
    "fsdp_state",
    "gpt",
    "mesh_model",
    "parallel_gpt",
    "sharding",
    "training",
}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)


__getattr__, __dir__ = lazy.attributes(__name__, _LAZY, _SUBMODULES)
