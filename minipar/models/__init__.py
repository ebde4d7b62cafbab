"""Models to train with minipar: a tiny GPT, its training text and its checkpoints.

    from minipar.models import GPTConfig, build_gpt, lm_loss
    from minipar.models.data import load_tokens, Batches
    from minipar.models import checkpoint

config.py is the run as plain data (model shape, layout), gpt.py the dense model (the reference
every parallel layout must match), parallel_gpt.py its tensor-parallel pipeline stages,
mesh_model.py one rank's share of it on a DeviceMesh (MeshGPT), sharding.py and fsdp_state.py
how dense tensors are cut and gathered back, data.py the shipped text and byte tokenizer,
checkpoint.py save/load of the dense weights, training.py the training loops. Importing this
package is light: each name loads (and torch with it) on first use, so `minipar train` checks a
RunSpec (config.py: plain data) before torch is imported.
"""

from __future__ import annotations

import importlib

_WHERE = {  # name -> the module it comes from
    "GPTConfig": "config",
    "RunSpec": "config",
    "GPT": "gpt",
    "Block": "gpt",
    "Embedding": "gpt",
    "Head": "gpt",
    "build_gpt": "gpt",
    "lm_loss": "gpt",
    "MeshGPT": "mesh_model",
}
_MODULES = ("checkpoint", "config", "data", "fsdp_state", "gpt", "mesh_model", "parallel_gpt",
            "sharding", "training")  # fmt: skip


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
