"""Checkpoints of the dense GPT: one file holds the config, the step and the full state dict.

    save("ckpt.pt", model, step=50)
    model, step = load("ckpt.pt")             # a dense GPT with those weights
    load_into(model, "ckpt.pt")               # into an existing dense model (shapes checked)

The file always holds the *dense* weights (the names and shapes of `GPT.state_dict()`), whatever
layout trained them: a parallel run gathers its shards into the dense layout before saving
(tensor-parallel slices all-gathered, pipeline stages' layers collected, FSDP's flat shards
unflattened), and slices them again on load, so a run on one layout resumes on another. This
module is that dense end; the gathering lives with the parallel build.
"""

from __future__ import annotations

import os

import torch

from minipar.models.config import GPTConfig
from minipar.models.gpt import GPT

FORMAT = "minipar-gpt/1"


def save(
    path: str,
    model_or_state,
    config: GPTConfig | None = None,
    step: int = 0,
    optimizer: dict | None = None,
    **extra,
):
    """Write the dense state dict (a GPT, or a state dict with `config` given) to `path`, with
    the optimizer's state by parameter name if given (training.optimizer_state), so that a
    resumed run takes the very steps the uninterrupted one would have.

    Tensors are detached CPU copies, so a checkpoint written on a GPU loads anywhere. A tied
    head is stored once (under embed.tok.weight) and re-tied on load."""
    if isinstance(model_or_state, GPT):
        config = model_or_state.config
        state = model_or_state.state_dict()
    elif config is None:
        raise ValueError("save: a state dict needs its GPTConfig (config=...)")
    else:
        state = dict(model_or_state)
    if config.tied_head:
        state.pop("head.proj.weight", None)
    record = {
        "format": FORMAT,
        "config": config.to_dict(),
        "step": int(step),
        "state_dict": {k: v.detach().to("cpu", copy=True) for k, v in state.items()},
        "optimizer": optimizer,
        "extra": extra,
    }
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    torch.save(record, path + ".tmp")
    os.replace(path + ".tmp", path)  # never a half-written checkpoint under the real name


def read(path: str) -> dict:
    """The raw record: format, config (a GPTConfig), step, state_dict, optimizer, extra."""
    record = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not a minipar GPT checkpoint (format {FORMAT})")
    record["config"] = GPTConfig(**record["config"])
    return record


def load_into(model: GPT, path: str) -> int:
    """Copy a checkpoint's weights into a dense GPT of the same config; returns its step."""
    record = read(path)
    if record["config"] != model.config:
        raise ValueError(
            f"checkpoint {path} is for {record['config']}, the model is {model.config}"
        )
    state = record["state_dict"]
    if model.config.tied_head:
        state["head.proj.weight"] = state["embed.tok.weight"]
    model.load_state_dict(state, strict=True)
    return record["step"]


def load(path: str) -> tuple[GPT, int]:
    """A dense GPT built from the checkpoint's config and weights, and the step it was saved at."""
    record = read(path)
    model = GPT(record["config"])
    load_into(model, path)
    return model, record["step"]
