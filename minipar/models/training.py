"""Training the tiny GPT: the dense reference on one process, and the same run on a DeviceMesh.

    spec = RunSpec(dp=2, steps=20)
    losses, model = train_dense(spec)                    # one process: the reference
    losses, model = train_on_mesh(spec, DeviceMesh(dp=2))  # every rank of the mesh

Both draw batch `step` from the same seeded stream (minipar.models.data.Batches), start from the
same weights (build_gpt(config, seed)) and use the same optimizer, so their losses agree step by
step up to float rounding (the order in which gradient pieces are summed differs). A step's
global batch of `batch_size` sequences is split over the dp ranks and, on each, into
`microbatches` micro-batches whose gradients accumulate; the reported loss is the mean over the
whole global batch, as the dense run computes it.

In this version the mesh run is data parallel only (tp = pp = 1), the gradients averaged by one
all-reduce of all of them, flattened, on dp_group after the backward pass (DDP with a single
bucket and no overlap: 4 bytes per parameter, 2(p-1)/p of it sent per rank by the ring). The
tensor- and pipeline-parallel build plugs in at `build_for_mesh` and `dense_state`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

import minipar
from minipar.models.data import Batches, dp_slice, load_tokens
from minipar.models.gpt import GPT, GPTConfig, build_gpt, lm_loss

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


@dataclass(frozen=True)
class RunSpec:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1  # per data-parallel rank per step
    schedule: str = "1f1b"
    fsdp: bool = False
    steps: int = 50
    batch_size: int = 8  # sequences per step, all ranks together
    lr: float = 3e-3
    seed: int = 0
    model: GPTConfig = field(default_factory=GPTConfig)

    def validate(self) -> None:
        """Every problem a layout can have that every rank can see alone (ValueError)."""
        for name in ("dp", "tp", "pp", "microbatches", "steps", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if self.batch_size % (self.dp * self.microbatches):
            raise ValueError(
                f"batch_size={self.batch_size} is not divisible by dp={self.dp} x "
                f"microbatches={self.microbatches}"
            )
        m = self.model
        if m.n_heads % self.tp:
            raise ValueError(f"n_heads={m.n_heads} is not divisible by tp={self.tp}")
        if m.vocab_size % self.tp:
            raise ValueError(f"vocab_size={m.vocab_size} is not divisible by tp={self.tp}")
        if m.n_layers % self.pp:
            raise ValueError(f"n_layers={m.n_layers} is not divisible by pp={self.pp}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.model.seq_len


def make_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """AdamW without weight decay: the same update on every layout."""
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)


def accumulate(model, inputs, targets, microbatches: int, scale: float) -> float:
    """Forward and backward over `microbatches` equal slices, gradients summed (each loss
    scaled by `scale` / microbatches); returns the mean loss over the slices."""
    total = 0.0
    for x, y in zip(inputs.chunk(microbatches), targets.chunk(microbatches)):
        loss = lm_loss(model(x), y)
        (loss * (scale / microbatches)).backward()
        total += loss.item() / microbatches
    return total


def train_dense(spec: RunSpec, on_step=None, model: GPT | None = None, start: int = 0):
    """The reference: the whole global batch on one process. Returns (losses, model)."""
    model = model or build_gpt(spec.model, spec.seed)
    opt = make_optimizer(model, spec.lr)
    batches = Batches(load_tokens(), spec.batch_size, spec.model.seq_len, spec.seed)
    losses = []
    for step in range(start, start + spec.steps):
        t0 = time.perf_counter()
        inputs, targets = batches.get(step)
        opt.zero_grad(set_to_none=True)
        losses.append(accumulate(model, inputs, targets, spec.microbatches, 1.0))
        opt.step()
        if on_step:
            on_step(step, losses[-1], time.perf_counter() - t0)
    return losses, model


def build_for_mesh(spec: RunSpec, mesh, model: GPT | None = None, device="cpu") -> GPT:
    """This rank's part of the model for the mesh, from the dense weights (seeded or given)."""
    if mesh.tp > 1 or mesh.pp > 1 or spec.fsdp:
        raise ValueError(
            f"minipar train: tp={mesh.tp}, pp={mesh.pp}{', --fsdp' if spec.fsdp else ''} need the "
            "tensor/pipeline/FSDP build of the GPT, which this version does not have yet; "
            "data parallelism alone (--dp N) works"
        )
    return (model or build_gpt(spec.model, spec.seed)).to(device)


def average_gradients(model: torch.nn.Module, group) -> None:
    """All-reduce every gradient, flattened into one buffer, and divide by the group's size."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    minipar.all_reduce(flat, group=group)
    flat /= minipar.get_world_size(group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def train_on_mesh(
    spec: RunSpec, mesh, on_step=None, model: GPT | None = None, start: int = 0, device="cpu"
):
    """The same run on this rank of the mesh. Returns (losses, this rank's model); every rank
    gets the global batch's mean loss."""
    spec.validate()
    model = build_for_mesh(spec, mesh, model, device)
    opt = make_optimizer(model, spec.lr)
    batches = Batches(load_tokens(), spec.batch_size, spec.model.seq_len, spec.seed)
    rows = dp_slice(spec.batch_size, mesh.dp_rank, mesh.dp)
    losses = []
    for step in range(start, start + spec.steps):
        t0 = time.perf_counter()
        inputs, targets = (t[rows].to(device) for t in batches.get(step))
        opt.zero_grad(set_to_none=True)
        local = accumulate(model, inputs, targets, spec.microbatches, 1.0)
        if mesh.dp > 1:
            average_gradients(model, mesh.dp_group)
        opt.step()
        loss = torch.tensor([local], dtype=torch.float64)
        minipar.all_reduce(loss, group=mesh.dp_group)
        losses.append(loss.item() / mesh.dp)
        if on_step:
            on_step(step, losses[-1], time.perf_counter() - t0)
    return losses, model


def dense_state(model: GPT, mesh) -> dict:
    """The dense state dict of the model this rank trained (data parallel: its own copy)."""
    if mesh.tp > 1 or mesh.pp > 1:  # the gather across tp and pp groups comes with that build
        raise ValueError("gathering a tensor/pipeline-parallel model needs its parallel build")
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def compare(losses, reference, state, reference_state, rtol: float = 1e-4, atol: float = 1e-5):
    """Loss at every step and every final parameter against the dense run: a list of problems
    (empty: they agree within |a - b| <= atol + rtol |b|, float32)."""
    problems = []
    for step, (a, b) in enumerate(zip(losses, reference)):
        if abs(a - b) > atol + rtol * abs(b):
            problems.append(f"step {step}: loss {a:.7f} vs dense {b:.7f}")
    for name, ref in reference_state.items():
        got = state[name].to(ref.dtype)
        if not torch.allclose(got, ref, rtol=rtol * 10, atol=atol * 10):
            worst = (got - ref).abs().max().item()
            problems.append(f"parameter {name}: max |difference| {worst:.3g}")
    return problems
