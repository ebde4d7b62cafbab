"""One rank's share of the tiny GPT on a DeviceMesh, and what a training step does with it.

    part = MeshGPT(spec, mesh)                 # from the seeded dense weights (or model=...)
    local = part.forward_backward(inputs, targets)   # this dp rank's rows of the global batch
    part.sync_grads()                          # tied head, then data parallel
    opt.step()
    state = part.dense_state()                 # collective: the dense state dict, every rank

A step, from the outside in:
- data parallel: the dp ranks take equal slices of the global batch; after the backward pass the
  gradients are averaged over dp_group (one all-reduce of every local gradient, 4 bytes per
  local parameter, ring 2(p-1)/p of it sent per rank);
- pipeline parallel (pp > 1): `Pipeline` runs the stage over pp_group with the run's schedule
  and micro-batches (activations forward, their gradients backward, point to point);
  pp = 1: the micro-batches run one after the other, their gradients accumulating;
- tensor parallel: inside every layer (see parallel_gpt.py); the loss is
  vocab_parallel_cross_entropy over tp_group, on the logits' vocabulary slices.

The reported loss is the whole global batch's mean on every rank: the last stage's mean is
averaged over dp_group and broadcast from the last stage over pp_group (8 bytes each).
"""

from __future__ import annotations

import functools

import torch

import minipar
from minipar.models import sharding
from minipar.models.gpt import build_gpt
from minipar.models.parallel_gpt import TiedHead, build_chunks, dense_named_parameters
from minipar.parallel.tensor import vocab_parallel_cross_entropy


def virtual_stages_of(spec, mesh) -> int:
    """Chunks per rank: 2 for the interleaved schedule on a real pipeline, else 1."""
    return 2 if spec.schedule == "interleaved" and mesh.pp > 1 else 1


class MeshGPT:
    def __init__(self, spec, mesh, model=None, device="cpu"):
        self.spec, self.mesh, self.config = spec, mesh, spec.model
        dense = model if model is not None else build_gpt(spec.model, spec.seed)
        v = virtual_stages_of(spec, mesh)
        self.chunks = [chunk.to(device) for chunk in build_chunks(dense, mesh, v)]
        self.tied = TiedHead(self.chunks, mesh, spec.model.tied_head)
        self.loss_fn = functools.partial(vocab_parallel_cross_entropy, group=mesh.tp_group)
        self.pipe = None
        if mesh.pp > 1:
            from minipar.parallel.pipeline import Pipeline

            self.pipe = Pipeline(
                self.chunks if v > 1 else self.chunks[0],
                group=mesh.pp_group,
                n_microbatches=spec.microbatches,
                schedule=spec.schedule,
                loss_fn=self.loss_fn if mesh.is_last_stage else None,
                virtual_stages=v,
            )

    def parameters(self) -> list[torch.nn.Parameter]:
        """This rank's parameters, each once (a tied head on one stage is one tensor)."""
        seen, out = set(), []
        for chunk in self.chunks:
            for q in chunk.parameters():
                if id(q) not in seen:
                    seen.add(id(q))
                    out.append(q)
        return out

    def named_parameters(self):
        """(dense name, this rank's tensor) for every dense parameter this rank holds."""
        return dense_named_parameters(self.chunks, self.mesh, self.config.tied_head)

    # -- a step -----------------------------------------------------------------------------
    def forward_backward(self, inputs, targets) -> float | None:
        """Gradients of this dp rank's rows accumulate in .grad; the rows' mean loss on the last
        pipeline stage, None on the others."""
        m = self.spec.microbatches
        if self.pipe is not None:
            first, last = self.mesh.is_first_stage, self.mesh.is_last_stage
            loss = self.pipe.step(inputs if first else None, targets if last else None)
            return None if loss is None else loss.item()
        total = 0.0
        for x, y in zip(inputs.chunk(m), targets.chunk(m)):
            loss = self.loss_fn(self.chunks[0](x), y)
            (loss / m).backward()
            total += loss.item() / m
        return total

    def sync_grads(self) -> None:
        """Sum the tied head's two copies' gradients, then average every gradient over dp."""
        self.tied.sync()
        if self.mesh.dp > 1:
            average_gradients(self.parameters(), self.mesh.dp_group)

    def global_loss(self, local: float | None) -> float:
        """The global batch's mean loss, the same number on every rank."""
        t = torch.tensor([local or 0.0], dtype=torch.float64)
        if self.mesh.dp > 1:
            minipar.all_reduce(t, group=self.mesh.dp_group)
        if self.mesh.pp > 1:
            minipar.broadcast(t, group=self.mesh.pp_group, group_src=self.mesh.pp - 1)
        return t.item() / self.mesh.dp

    # -- dense views (collective: every rank of the mesh calls them) -----------------------
    def dense_state(self) -> dict[str, torch.Tensor]:
        """The dense model's state dict (CPU tensors, GPT.state_dict's names) on every rank."""
        pieces = {name: q.detach() for name, q in self.named_parameters()}
        state = sharding.gather_dense(pieces, self.mesh, self.config)
        state = {name: t.cpu() for name, t in state.items()}
        if self.config.tied_head:
            state["head.proj.weight"] = state["embed.tok.weight"]
        return state

    def optimizer_state(self, opt) -> dict:
        """AdamW's state by dense parameter name, gathered like the weights (every rank)."""
        if not opt.state:  # no step taken yet
            return {}
        named = list(self.named_parameters())
        out = {}
        for key in ("exp_avg", "exp_avg_sq"):
            pieces = {name: opt.state[q][key] for name, q in named}
            for name, full in sharding.gather_dense(pieces, self.mesh, self.config).items():
                out.setdefault(name, {})[key] = full.cpu()
        step = next(iter(opt.state.values()))["step"]
        for record in out.values():
            record["step"] = step.detach().clone().cpu()
        return out

    def load_optimizer_state(self, opt, states) -> None:
        """The inverse of optimizer_state: each tensor sliced for this rank's tp rank."""
        if not states:
            return
        mesh = self.mesh
        for chunk in self.chunks:
            for name, q in chunk.named_parameters():
                dense = states["embed.tok.weight" if self._is_tied_copy(name) else name]
                opt.state[q] = {
                    k: v.clone() if k == "step" else
                    sharding.shard(name, v, mesh.tp_rank, mesh.tp).to(q.device)
                    for k, v in dense.items()
                }  # fmt: skip

    def _is_tied_copy(self, name: str) -> bool:
        return self.config.tied_head and name == "head.proj.weight"


def average_gradients(params, group) -> None:
    """All-reduce every gradient, flattened into one buffer, and divide by the group's size."""
    grads = [q.grad for q in params if q.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    minipar.all_reduce(flat, group=group)
    flat /= minipar.get_world_size(group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
