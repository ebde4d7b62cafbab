"""Loading a sharded checkpoint into any layout: each rank reads only the pieces it needs.

    folder, manifest = choose(root, comm)               # rank 0 checks, every rank agrees
    model, opt_state, step, extra = load_for_mesh(folder, manifest, spec, mesh)
    losses, part, opt = training.train_on_mesh(spec, mesh, None, model, step, ..., opt_state)
    state, opt_state = load_dense(folder)                # the whole dense model on one process

A rank of the new layout needs the dense names of its pipeline stages (checkpoint_pieces.
stage_names) and, of each, its new tensor-parallel (or expert) slice; it opens the shard files
that hold those names (memory-mapped: pages never touched are never read) and, of each name,
reads only the old pieces that overlap its new slice (checkpoint_pieces.needed), each from the
flat ranges the old ranks wrote (whole tp slices, or FSDP's parts of them). Those fill a dense
GPT's tensors where this rank will look; MeshGPT then cuts its slices from it as it does from a
seeded model, and its optimizer state the same way. Saved at dp 3 x tp 2 and loaded at tp 2,
rank r reads the pieces of tp rank r % 2 only; loaded at tp 1, both.
"""

from __future__ import annotations

import shutil

import torch

from minipar.models import checkpoint_files as files
from minipar.models import sharding
from minipar.models.checkpoint_pieces import KINDS, assemble, cut_for, stage_names
from minipar.models.config import GPTConfig
from minipar.models.gpt import GPT


def choose(root: str, comm, log=print) -> tuple[str | None, dict | None]:
    """The newest whole checkpoint under root, checked by rank 0 (sizes and sha256 of every
    file) and agreed by every rank of `comm` (collective); rank 0 logs each newer one it passed
    over and why, and removes them before any rank can save (this run writes those steps
    again, never into what a dead job left). (None, None) when there is none."""
    found = None
    if comm.rank == 0:
        folder, manifest, passed = files.newest_whole(root)
        for line in passed:
            log(line)
        found = (folder, manifest)
        start = manifest["step"] if manifest else -1
        for step in files.steps(root):  # not whole: this run saves those steps afresh
            if step > start:
                shutil.rmtree(files.step_dir(root, step), ignore_errors=True)
    return tuple(comm.allgather_object(found)[0])


class _Reader:
    """Saved tensors by (file, key), each shard file opened once, memory-mapped."""

    def __init__(self, folder: str):
        self.folder, self.open, self.bytes = folder, {}, 0

    def __call__(self, meta: dict) -> torch.Tensor:
        name = meta["file"]
        if name not in self.open:
            path = f"{self.folder}/{name}"
            self.open[name] = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        tensor = self.open[name][meta["key"]]
        self.bytes += tensor.numel() * tensor.element_size()
        return tensor


def index(manifest: dict) -> dict[tuple[str, str], list[dict]]:
    """(kind, name) -> the metas of its saved pieces."""
    out = {}
    for meta in manifest["pieces"]:
        out.setdefault((meta["kind"], meta["name"]), []).append(meta)
    return out


def load_for_mesh(folder: str, manifest: dict, spec, mesh):
    """(a dense GPT whose tensors hold what this rank of `mesh` needs, AdamW's state by dense
    name for those names ({} if none was saved), the step to resume at, the extra record).
    `spec`'s model must be the checkpoint's; its layout may differ. No communication."""
    config = GPTConfig(**manifest["config"])
    if config != spec.model:
        raise ValueError(f"checkpoint {folder} is for {config}, the run is for {spec.model}")
    pieces, reader, shapes = index(manifest), _Reader(folder), sharding.dense_shapes(config)
    state, opt_state = {}, {}
    for name in stage_names(spec, mesh):
        _, p, q = cut_for(name, mesh)
        for kind in KINDS:
            entries = pieces.get((kind, name))
            if not entries:
                if kind == "param":
                    raise ValueError(f"checkpoint {folder} holds no piece of {name}")
                continue
            full = assemble(entries, shapes[name], reader, p, q)
            if kind == "param":
                state[name] = full
            else:
                opt_state.setdefault(name, {})[kind] = full
    adam_step = manifest["extra"].get("adam_step")
    for record in opt_state.values() if adam_step is not None else ():
        record["step"] = torch.tensor(float(adam_step))
    model = GPT(config)
    missing = set(state) - set(model.state_dict())
    if missing:
        raise ValueError(f"checkpoint {folder}: unknown tensors {sorted(missing)}")
    model.load_state_dict(state, strict=False)
    extra = dict(manifest["extra"], bytes_read=reader.bytes)  # what this rank read
    return model, opt_state, manifest["step"], extra


def load_dense(folder: str, manifest: dict | None = None) -> tuple[dict, dict]:
    """The whole dense state dict and AdamW's state by name, on one process (for --check, the
    tests and the lesson): every piece of every name read."""
    if manifest is None:
        wrong, manifest = files.problem(folder)
        if wrong:
            raise ValueError(f"checkpoint {folder} not loaded: {wrong}")
    config = GPTConfig(**manifest["config"])
    pieces, reader = index(manifest), _Reader(folder)
    state, opt_state = {}, {}
    for name, shape in sharding.dense_shapes(config).items():
        for kind in KINDS:
            entries = pieces.get((kind, name))
            if entries:
                full = assemble(entries, shape, reader, 1, 0)
                if kind == "param":
                    state[name] = full
                else:
                    opt_state.setdefault(name, {})[kind] = full
    for record in opt_state.values():
        record["step"] = torch.tensor(float(manifest["extra"].get("adam_step") or 0))
    if config.tied_head:
        state["head.proj.weight"] = state["embed.tok.weight"]
    return state, opt_state
