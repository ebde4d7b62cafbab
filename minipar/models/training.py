"""Training the tiny GPT: the dense reference on one process, and the same run on a DeviceMesh.

    spec = RunSpec(dp=2, steps=20)
    losses, model = train_dense(spec)                    # one process: the reference
    losses, model = train_on_mesh(spec, DeviceMesh(dp=2))  # every rank of the mesh

Both draw batch `step` from the same seeded stream (minipar.models.data.Batches), start from the
same weights (build_gpt(config, seed)) and use the same optimizer, so their losses agree step by
step up to float rounding (the order in which gradient pieces are summed differs). A step's
global batch of `batch_size` sequences is split over the dp ranks and, on each, into
`microbatches` micro-batches whose gradients accumulate; the reported loss is the mean over the
whole global batch, as the dense run computes it. So are the gradients, once synchronised:
`dense_gradients` is the reference, `compare_gradients` the check (`on_grads` of train_on_mesh
sees them before the optimizer does).

On a mesh each rank trains its MeshGPT (minipar.models.mesh_model): its tensor-parallel slice of
its pipeline stage (its seq/cp tokens with context parallelism, its E/ep experts with expert
parallelism), gradients averaged over the dp x cp ranks; `dense_state` gathers the dense
weights back from any layout, so checkpoints move between layouts, and `dense_grads` the
gradients, so `--check` compares them with the dense run's after the first step.

With MoE blocks the dense reference is the same GPT with every expert local (DenseMoE): the
router is per token and dropless, so every token takes the same experts with the same gates on
any layout, and only the float rounding differs. The load-balancing auxiliary loss is not added
to the training loss (it is per rank's tokens, so the layouts would train different losses);
each MoE layer's load (`MeshGPT.moe_stats`) is reported instead.
"""

from __future__ import annotations

import copy
import time

import torch

from minipar.comm import ledger
from minipar.models.config import SCHEDULES, RunSpec  # noqa: F401  (re-exported)
from minipar.models.data import Batches, dp_slice, load_tokens
from minipar.models.gpt import GPT, build_gpt, lm_loss
from minipar.models.mesh_model import MeshGPT, virtual_stages_of
from minipar.models.parallel_gpt import check_layout
from minipar.parallel.mesh import DeviceMesh


def make_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """AdamW without weight decay: the same update on every layout."""
    return make_optimizer_for(model.parameters(), lr)


def make_optimizer_for(params, lr: float) -> torch.optim.Optimizer:
    """AdamW on these parameters (elementwise, so a slice of a tensor takes the slice of the
    dense update)."""
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)


def optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    """AdamW's state (exp_avg, exp_avg_sq, step) keyed by each parameter's dense name, on CPU:
    what a checkpoint stores so that a resumed run takes exactly the steps it would have."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        names[id(p)]: {k: v.detach().to("cpu", copy=True) for k, v in st.items()}
        for p, st in opt.state.items()
    }


def load_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer, states) -> None:
    """The inverse of optimizer_state (the step counters stay on the CPU, as AdamW keeps them)."""
    params = dict(model.named_parameters())
    for name, st in (states or {}).items():
        p = params[name]
        opt.state[p] = {k: v if k == "step" else v.to(p.device) for k, v in st.items()}


def accumulate(model, inputs, targets, microbatches: int, scale: float) -> float:
    """Forward and backward over `microbatches` equal slices, gradients summed (each loss
    scaled by `scale` / microbatches); returns the mean loss over the slices."""
    total = 0.0
    for x, y in zip(inputs.chunk(microbatches), targets.chunk(microbatches)):
        loss = lm_loss(model(x), y)
        (loss * (scale / microbatches)).backward()
        total += loss.item() / microbatches
    return total


def train_dense(
    spec: RunSpec, on_step=None, model: GPT | None = None, start: int = 0, opt_state=None
):
    """The reference: the whole global batch on one process, from `model` (default: seeded)
    and optimizer state `opt_state` (default: fresh). Returns (losses, model, optimizer)."""
    model = model or build_gpt(spec.model, spec.seed)
    opt = make_optimizer(model, spec.lr)
    load_optimizer_state(model, opt, opt_state)
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
    return losses, model, opt


def mesh_for(spec: RunSpec, group=None):
    """The DeviceMesh of the spec's layout over `group` (collective: every rank calls it)."""
    return DeviceMesh(spec.dp, spec.tp, spec.pp, group=group, cp=spec.cp, ep=spec.ep)


def check_supported(spec: RunSpec, mesh) -> None:
    """ValueError (on every rank alike) for a layout this model cannot be cut into."""
    spec.validate()
    mine = (spec.dp, spec.tp, spec.pp, spec.cp, spec.ep)
    if (mesh.dp, mesh.tp, mesh.pp, mesh.cp, mesh.ep) != mine:
        raise ValueError(
            f"the run is {spec.layout} but the mesh is {mesh.shape}: build it with "
            "training.mesh_for(spec)"
        )
    check_layout(spec.model, mesh.tp, mesh.pp, virtual_stages_of(spec, mesh))
    if spec.fsdp and mesh.pp > 1 and spec.schedule == "zb-h1":
        raise ValueError(
            "--fsdp with schedule zb-h1: FSDP reduce-scatters a unit's gradient when its "
            "backward runs, which zb-h1 splits in two; choose gpipe, 1f1b or interleaved"
        )
    if spec.fsdp and mesh.pp > 1 and spec.model.tied_head:
        raise ValueError(
            "--fsdp with a tied head across pipeline stages (pp > 1): the two copies' "
            "gradients would have to be summed shard by shard; untie it or use DDP"
        )


def build_for_mesh(spec: RunSpec, mesh, model: GPT | None = None, device="cpu"):
    """This rank's part of the model for the mesh (a MeshGPT), from the dense weights (seeded or
    given): every layout starts from the same numbers."""
    check_supported(spec, mesh)
    return MeshGPT(spec, mesh, model, device)


def train_on_mesh(
    spec: RunSpec,
    mesh,
    on_step=None,
    model: GPT | None = None,
    start: int = 0,
    device="cpu",
    opt_state=None,
    on_grads=None,
):
    """The same run on this rank of the mesh. Returns (losses, this rank's MeshGPT, optimizer);
    every rank gets the global batch's mean loss at every step. `on_grads(step, part)` runs on
    every rank once the step's gradients are synchronised, before the optimizer moves the
    weights (it may be collective: e.g. part.dense_grads(), to check them)."""
    spec.validate()
    part = build_for_mesh(spec, mesh, model, device)
    opt = make_optimizer_for(part.parameters(), spec.lr)
    part.load_optimizer_state(opt, opt_state)  # dense names, sliced for this rank
    batches = Batches(load_tokens(), spec.batch_size, spec.model.seq_len, spec.seed)
    rows = dp_slice(spec.batch_size, mesh.dp_rank, mesh.dp)
    losses = []
    for step in range(start, start + spec.steps):
        t0 = time.perf_counter()
        with ledger.span(f"step {step}", "train"):  # a trace's mark (comm/ledger.py)
            inputs, targets = (part.shard_batch(t[rows]).to(device) for t in batches.get(step))
            opt.zero_grad(set_to_none=True)
            local = part.forward_backward(inputs, targets)
            part.sync_grads()
            if on_grads:
                on_grads(step, part)
            opt.step()
            losses.append(part.global_loss(local))
        if on_step:
            on_step(step, losses[-1], time.perf_counter() - t0)
    return losses, part, opt


def dense_gradients(spec: RunSpec, model: GPT | None = None, step: int = 0) -> dict:
    """The reference gradient: the dense model's (seeded, or a copy of `model`) gradient of the
    mean loss over batch `step`'s whole global batch, one forward and one backward with no
    micro-batches, by parameter name. A mesh's step, once its gradients are synchronised, must
    give these numbers whatever its layout and micro-batch count."""
    model = copy.deepcopy(model) if model is not None else build_gpt(spec.model, spec.seed)
    inputs, targets = Batches(load_tokens(), spec.batch_size, spec.model.seq_len, spec.seed).get(
        step
    )
    model.zero_grad(set_to_none=True)
    lm_loss(model(inputs), targets).backward()
    return {name: q.grad.detach().clone() for name, q in model.named_parameters()}


def compare_gradients(grads: dict, reference: dict, rtol: float = 1e-4) -> list[str]:
    """Every gradient against the dense one: a list of problems (empty: each tensor within
    rtol of its largest element, |g - ref| <= rtol max|ref|). Weights after AdamW barely show a
    gradient scaled by a constant (Adam divides it out); this does, and says the norm ratio."""
    problems = []
    if set(grads) != set(reference):
        problems.append(f"gradient names differ: {sorted(set(grads) ^ set(reference))}")
    for name, ref in reference.items():
        if name not in grads:
            continue
        got = grads[name].to(ref.dtype)
        worst = (got - ref).abs().max().item()
        if worst > rtol * ref.abs().max().item():
            ratio = got.norm().item() / max(ref.norm().item(), 1e-30)
            problems.append(
                f"gradient of {name}: max |difference| {worst:.3g}, norm {ratio:.4g}x the dense"
            )
    return problems


def dense_state(part, mesh=None) -> dict:
    """The dense state dict of the model the mesh trained, on every rank (collective: every
    rank calls it): tensor-parallel slices all-gathered, pipeline stages collected."""
    if isinstance(part, GPT):
        return {k: v.detach().cpu() for k, v in part.state_dict().items()}
    return part.dense_state()


def mesh_optimizer_state(part, opt) -> dict:
    """optimizer_state for a dense GPT or a MeshGPT (then collective: every rank calls it)."""
    if isinstance(part, GPT):
        return optimizer_state(part, opt)
    return part.optimizer_state(opt)


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
