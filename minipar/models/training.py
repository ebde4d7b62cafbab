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

Both runs take the spec's precision policy (models/precision.py: the forward under autocast,
fp32 weights, gradients and AdamW; fp16 with a loss scaler whose skips the whole mesh decides),
clip (`finish_step`: torch's clip_grad_norm_ on the dense model, minipar.parallel's on the mesh)
and learning rate per step (RunSpec.lr_at: models/lr_schedule.py); `stats` collects each
step's norm, lr and skip, and `tolerances` says how close the two runs must stay.

With MoE blocks the dense reference is the same GPT with every expert local (DenseMoE): the
router is per token and dropless, so every token takes the same experts with the same gates on
any layout, and only the float rounding differs. The load-balancing auxiliary loss is not added
to the training loss (it is per rank's tokens, so the layouts would train different losses);
each MoE layer's load (`MeshGPT.moe_stats`) is reported instead.
"""

from __future__ import annotations

import copy
import math
import time

import torch

from minipar.comm.trace import ledger
from minipar.models import precision
from minipar.models.config import SCHEDULES, RunSpec  # noqa: F401  (re-exported)
from minipar.models.data import Batches, dp_slice, load_tokens
from minipar.models.gpt import GPT, build_gpt, lm_loss
from minipar.models.lr_schedule import set_lr
from minipar.models.mesh_model import MeshGPT, virtual_stages_of
from minipar.models.parallel_gpt import check_layout
from minipar.parallel.clip_grad import clip_grad_norm_
from minipar.parallel.loss_scale import LossScaler
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


def accumulate(
    model, inputs, targets, microbatches: int, scale: float, dtype: str = "fp32"
) -> float:
    """Forward and backward over `microbatches` equal slices, gradients summed (each loss
    scaled by `scale` / microbatches); returns the mean loss over the slices. The forward runs
    in the precision policy `dtype` (models/precision.py), the loss on fp32 logits."""
    total = 0.0
    for x, y in zip(inputs.chunk(microbatches), targets.chunk(microbatches)):
        with precision.autocast(dtype, x.device.type):
            logits = model(x)
        loss = lm_loss(logits.float(), y)
        (loss * (scale / microbatches)).backward()
        total += loss.item() / microbatches
    return total


def unscale(scaler, params) -> bool:
    """fp16: the gradients divided by the loss scale; False when some rank's hold an inf or
    NaN (the same answer on every rank). Without a scaler: True, nothing done."""
    return scaler.unscale_(params) if scaler is not None else True


def finish_step(opt, params, spec: RunSpec, step: int, start: int, scaler, clip, ok) -> dict:
    """The optimizer's side of a step once the gradients are unscaled (`ok`: finite), the
    same for the dense run and the mesh's: clip the whole model's gradient norm
    (`clip(params, max_norm)`: torch's, or the mesh's), set the scheduled learning rate, step
    (fp16: skipped when not ok, on every rank alike). Returns {"norm", "skipped", "lr"}."""
    norm = None
    if spec.clip is not None:
        norm = float(clip(params, spec.clip)) if ok else float("inf")
    lr = spec.lr_at(step, start)
    if ok:
        set_lr(opt, lr)
        opt.step()
    if scaler is not None:
        scaler.update()
    return {"norm": norm, "skipped": not ok, "lr": lr}


def make_scaler(spec: RunSpec, mesh=None, state=None):
    """fp16's dynamic loss scaler (over the mesh's ranks; None: one process), from a
    checkpoint's `state` if given; None for bf16 and fp32."""
    if spec.dtype != "fp16":
        return None
    scaler = LossScaler(mesh=mesh)
    if state:
        scaler.load_state_dict(state)
    return scaler


def record(stats, done: dict, scaler) -> None:
    """A step's norm, skip and lr appended to `stats` (a dict, or None: nothing kept)."""
    if stats is None:
        return
    for key, value in done.items():
        stats.setdefault(key + "s" if key != "skipped" else key, []).append(value)
    stats["scaler"] = scaler.state_dict() if scaler is not None else None


def train_dense(
    spec: RunSpec,
    on_step=None,
    model: GPT | None = None,
    start: int = 0,
    opt_state=None,
    stats=None,
    scaler_state=None,
):
    """The reference: the whole global batch on one process, from `model` (default: seeded)
    and optimizer state `opt_state` (default: fresh), with the spec's precision, clip (torch's
    clip_grad_norm_) and learning-rate schedule. Returns (losses, model, optimizer); `stats`
    (a dict) gets each step's "norms", "skipped", "lrs" and the loss scaler's state."""
    model = model or build_gpt(spec.model, spec.seed)
    opt = make_optimizer(model, spec.lr)
    load_optimizer_state(model, opt, opt_state)
    batches = Batches(load_tokens(), spec.batch_size, spec.model.seq_len, spec.seed)
    scaler = make_scaler(spec, None, scaler_state)
    clip = torch.nn.utils.clip_grad_norm_
    losses, params = [], list(model.parameters())
    for step in range(start, start + spec.steps):
        t0 = time.perf_counter()
        inputs, targets = batches.get(step)
        opt.zero_grad(set_to_none=True)
        scale = scaler.scale if scaler is not None else 1.0
        loss = accumulate(model, inputs, targets, spec.microbatches, scale, spec.dtype)
        losses.append(loss)
        ok = unscale(scaler, params)
        record(stats, finish_step(opt, params, spec, step, start, scaler, clip, ok), scaler)
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
    stats=None,
    scaler_state=None,
    after_step=None,
):
    """The same run on this rank of the mesh. Returns (losses, this rank's MeshGPT, optimizer);
    every rank gets the global batch's mean loss at every step. `on_grads(step, part)` runs on
    every rank once the step's gradients are synchronised, before the optimizer moves the
    weights (it may be collective: e.g. part.dense_grads(), to check them): unscaled (fp16),
    not yet clipped. `stats` as train_dense's: the
    norm from minipar.parallel.clip_grad_norm_ over the mesh, the same bits on every rank.
    `after_step(step, part, opt)` runs on every rank once the step's update is done, inside
    the step's time (a checkpoint's save: models/checkpoint_saver.py)."""
    spec.validate()
    part = build_for_mesh(spec, mesh, model, device)
    opt = make_optimizer_for(part.parameters(), spec.lr)
    part.load_optimizer_state(opt, opt_state)  # dense names, sliced for this rank
    batches = Batches(load_tokens(), spec.batch_size, spec.model.seq_len, spec.seed)
    rows = dp_slice(spec.batch_size, mesh.dp_rank, mesh.dp)
    scaler = make_scaler(spec, mesh, scaler_state)
    params = part.parameters()
    losses = []
    for step in range(start, start + spec.steps):
        t0 = time.perf_counter()
        with ledger.span(f"step {step}", "train"):  # a trace's mark (comm/trace/ledger.py)
            inputs, targets = (part.shard_batch(t[rows]).to(device) for t in batches.get(step))
            opt.zero_grad(set_to_none=True)
            scale = scaler.scale if scaler is not None else 1.0
            local = part.forward_backward(inputs, targets, scale)
            part.sync_grads()
            ok = unscale(scaler, params)
            if on_grads:
                on_grads(step, part)
            done = finish_step(opt, params, spec, step, start, scaler, mesh_clip(mesh), ok)
            record(stats, done, scaler)
            losses.append(part.global_loss(local))
            if after_step:
                after_step(step, part, opt)
        if on_step:
            on_step(step, losses[-1], time.perf_counter() - t0)
    return losses, part, opt


def mesh_clip(mesh):
    """clip(params, max_norm) for finish_step: the whole mesh's norm, one factor."""
    return lambda params, max_norm: clip_grad_norm_(params, max_norm, mesh=mesh)


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
    with precision.autocast(spec.dtype, inputs.device.type):  # the run's precision policy
        logits = model(inputs)
    lm_loss(logits.float(), targets).backward()
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


def compare(losses, reference, state, reference_state, rtol=1e-4, atol=1e-5, params_tol=None):
    """Loss at every step and every final parameter against the dense run: a list of problems
    (empty: they agree within |a - b| <= atol + rtol |b|, float32; the parameters within
    params_tol = (rtol, atol), default ten times the losses')."""
    problems = []
    for step, (a, b) in enumerate(zip(losses, reference)):
        if abs(a - b) > atol + rtol * abs(b):
            problems.append(f"step {step}: loss {a:.7f} vs dense {b:.7f}")
    p_rtol, p_atol = params_tol or (rtol * 10, atol * 10)
    for name, ref in reference_state.items():
        got = state[name].to(ref.dtype)
        if not torch.allclose(got, ref, rtol=p_rtol, atol=p_atol):
            worst = (got - ref).abs().max().item()
            problems.append(f"parameter {name}: max |difference| {worst:.3g}")
    return problems


def compare_norms(stats: dict, reference: dict, rtol: float, start: int = 0) -> list[str]:
    """Every step's gradient norm (--clip) and skip (fp16) against the dense run's: a list of
    problems (empty: |a - b| <= rtol |b| at every step, the same steps skipped)."""
    problems = []
    norms, ref_norms = stats.get("norms") or [], reference.get("norms") or []
    for step, (a, b) in enumerate(zip(norms, ref_norms), start):
        if a is None or b is None or not math.isfinite(b):
            continue
        if not abs(a - b) <= rtol * abs(b):
            problems.append(f"step {step}: gradient norm {a:.7g} vs dense {b:.7g}")
    if stats.get("skipped") != reference.get("skipped"):
        problems.append(f"skipped steps {stats.get('skipped')} vs dense {reference.get('skipped')}")
    return problems


# Unit roundoff of the compute dtype: half the spacing of the numbers near 1
ROUNDOFF = {"fp32": 2.0**-24, "bf16": 2.0**-9, "fp16": 2.0**-11}


def tolerances(spec: RunSpec) -> dict:
    """How far the mesh's run may be from the dense twin's under the spec's precision policy.

    fp32: the checks' long-standing figures (gradients 1e-4 of each tensor's largest element,
    losses 1e-4 relative, the norm 1e-5 relative). Lower precision: both runs round the same
    fp32 weights and the same activations to the compute dtype at the same ops, but the mesh
    sums some products in other pieces (a tensor-parallel matmul's partial sums, rounded to
    the compute dtype before the all-reduce adds them; micro-batches; the data-parallel sum),
    and each such place may put one more rounding, of relative size at most u (the dtype's
    unit roundoff), on a value. A block has 4 such places forward (attention's and the MLP's
    matmul outputs, each summed across tp) and 4 backward, so a gradient passes through
    k = 8 L + 4 of them for L blocks (the embedding and head add 4). In the worst case the
    errors add, k u (bf16, L = 8: 0.13, far above anything seen); rounding errors of
    independent sign grow as sqrt(k) u instead (Higham and Mary's probabilistic bound, SIAM J.
    Sci. Comput. 2019: at most lambda sqrt(k) u except with probability 2 exp(-lambda^2 / 2)),
    and with lambda = 3 that is the bound used: 3 sqrt(k) u for the gradients and the norm
    (bf16, L = 8: 0.048; measured at tp = pp = 2: 0.0053 and 0.0016), half of it for the
    losses (the forward's places only). The weights after AdamW, which moves each element by
    about lr whatever the size of its gradient, may differ by lr per step (an element whose
    gradient is at rounding level may step either way), plus the gradients' bound relative."""
    if spec.dtype == "fp32":
        return {"grad": 1e-4, "norm": 1e-5, "loss": 1e-4, "loss_atol": 1e-5, "params": None}
    k = 8 * spec.model.n_layers + 4
    bound = 3 * math.sqrt(k) * ROUNDOFF[spec.dtype]
    return {
        "grad": bound,
        "norm": bound,
        "loss": bound / 2,
        "loss_atol": 1e-5,
        "params": (bound, 2 * spec.lr * spec.steps),
    }


def gaps(grads, reference_grads, stats, reference_stats, losses, reference_losses) -> dict:
    """The largest differences the checks saw, each as its tolerance measures it: gradients
    (|g - ref| / max|ref|, worst tensor), norms and losses (relative, worst step)."""

    def rel(a, b):
        return abs(a - b) / max(abs(b), 1e-30)

    grad = max(
        ((grads[n].to(r.dtype) - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
        for n, r in reference_grads.items()
        if n in grads
    ) if grads else 0.0  # fmt: skip
    pairs = zip(stats.get("norms") or [], reference_stats.get("norms") or [])
    norm = max((rel(a, b) for a, b in pairs if a is not None and math.isfinite(b)), default=0.0)
    loss = max((rel(a, b) for a, b in zip(losses, reference_losses)), default=0.0)
    return {"grad": grad, "norm": norm, "loss": loss}
