"""The whole mesh's gradient norm and clip (run by tests/test_clip_grad.py, one launch of 4
ranks): on layouts that copy parameters every way (LayerNorms over tp, everything over dp,
experts over tp and dp, a tied head's copy over pp, FSDP shards mixing both), the norm that
minipar.parallel.clip_grad_norm_ returns is torch.nn.utils.clip_grad_norm_'s on the dense model
(relative 1e-5, float32), the same bits on every rank, and the clipped gradients, gathered back
dense, are the dense model's clipped ones.

The planted mistakes each make that check fail (`problems` not empty, on the ranks that see
it): a replicated parameter counted per tp rank, a stage's norm not summed across pp, experts
counted per dp replica, the clip factor applied on one stage only, the loss scale not undone
before the clip (fp16). And fp16 training with the loss scaler against the dense twin (one
rank's overflow skips the step on every rank), DDP's bf16 reduction at half the bytes.
"""

import copy
import dataclasses
import functools
import math

import torch

import minipar
from minipar.models import mesh_model, precision, training
from minipar.models.config import GPTConfig, RunSpec
from minipar.models.gpt import build_gpt
from minipar.models.state_bytes import state_bytes
from minipar.parallel import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    ZeroRedundancyOptimizer,
    clip_grad,
    clip_grad_norm_,
    replicas,
)
from minipar.parallel.loss_scale import LossScaler
from minipar.parallel.mesh import DeviceMesh
from minipar.parallel.tensor import ColumnParallelLinear, RowParallelLinear

TINY = GPTConfig(seq_len=16, hidden=32, n_layers=2, n_heads=4)
NORM_RTOL = 1e-5
MAX_NORM = 0.05  # below the first step's norm (~1.5): the clip scales


@functools.cache
def dense_clipped(model, norm_type):
    """(norm, clipped gradients by name) of the dense model on batch 0, by torch."""
    grads = training.dense_gradients(RunSpec(model=model))
    dense = build_gpt(model, 0)
    params = dict(dense.named_parameters())
    for name, g in grads.items():
        params[name].grad = g.clone()
    norm = torch.nn.utils.clip_grad_norm_(dense.parameters(), MAX_NORM, norm_type)
    return norm.item(), {n: q.grad.clone() for n, q in params.items()}


def step_once(spec, group=None, plant=None):
    """One forward, backward and gradient sync of `spec` on a mesh over `group`, then the
    clip (with `plant`'s mistake): (norm, part, mesh)."""
    mesh = training.mesh_for(spec, group)
    part = mesh_model.MeshGPT(spec, mesh)
    batches = training.Batches(training.load_tokens(), spec.batch_size, spec.model.seq_len, 0)
    rows = training.dp_slice(spec.batch_size, mesh.dp_rank, mesh.dp)
    inputs, targets = (part.shard_batch(t[rows]) for t in batches.get(0))
    part.forward_backward(inputs, targets)
    part.sync_grads()
    params = part.parameters()
    if plant == "tp_copy_counted":  # LayerNorms, biases marked pieces: counted per tp rank
        for q in params:
            sharded = replicas.marks(q)[0]
            if not any(g is mesh.tp_group for g in sharded):
                setattr(q, replicas.SHARDED, (*sharded, mesh.tp_group))
    if plant == "experts_per_dp":  # experts marked each dp rank's own: counted per replica
        for q in params:
            if getattr(q, "expert_parallel", False):
                setattr(q, replicas.SHARDED, (*replicas.marks(q)[0], mesh.dp_cp_group))
                setattr(q, replicas.ATTRIBUTE, ())
    if plant == "one_stage_clipped":  # the other stages keep their gradients unscaled
        norm = clip_grad.total_norm(params, 2.0, mesh)
        if mesh.pp_rank == 0:
            for q in params:
                q.grad.mul_(torch.clamp(MAX_NORM / (norm + clip_grad.EPS), max=1.0))
        return norm, part, mesh
    return clip_grad_norm_(params, MAX_NORM, mesh=mesh), part, mesh


def problems_of(spec, group=None, plant=None, norm_type=2.0):
    """What differs from the dense model's clip (every rank gets the same list)."""
    norm, part, mesh = step_once(spec, group, plant)
    grads = part.dense_grads()  # collective: every rank
    ref_norm, ref_grads = dense_clipped(spec.model, norm_type)
    found = []
    bits = mesh.group.allgather_object(norm.item())
    if len(set(bits)) != 1:
        found.append(f"the norm differs between ranks: {bits}")
    if abs(norm.item() - ref_norm) > NORM_RTOL * ref_norm:
        found.append(f"norm {norm.item():.7g} vs dense {ref_norm:.7g}")
    found += training.compare_gradients(grads, ref_grads, 1e-4)
    seen = mesh.group.allgather_object(found)
    return sorted({p for mine in seen for p in mine})


def spec_of(dp, tp, pp, **kw):
    experts = kw.pop("experts", 0)
    model = dataclasses.replace(TINY, n_experts=experts, tied_head=kw.pop("tied", False))
    return RunSpec(dp, tp, pp, kw.pop("m", 2), model=model, **kw)


LAYOUTS = {  # name -> the 4-rank run
    "dp1_tp2_pp2_tied": spec_of(1, 2, 2, tied=True),
    "dp2_tp2_pp1_moe_ep1": spec_of(2, 2, 1, experts=4),
    "dp2_tp1_pp2_moe_ep2": spec_of(2, 1, 2, experts=4, ep=2),
    "dp2_tp2_pp1_fsdp": spec_of(2, 2, 1, fsdp=True),
    "dp1_cp2_tp2": spec_of(1, 2, 1, cp=2),
    "dp4_moe_ep2": spec_of(4, 1, 1, experts=4, ep=2),  # experts cut over half the dp line
}
PLANTS = {  # mistake -> the layout that shows it
    "tp_copy_counted": "dp1_tp2_pp2_tied",
    "pp_not_summed": "dp1_tp2_pp2_tied",
    "experts_per_dp": "dp2_tp2_pp1_moe_ep1",
    "one_stage_clipped": "dp2_tp1_pp2_moe_ep2",
}


def layout_case(name):
    def case():
        minipar.init()
        found = problems_of(LAYOUTS[name])
        assert not found, "; ".join(found)

    return case


def plant_case(plant):
    def case():
        minipar.init()
        spec = LAYOUTS[PLANTS[plant]]
        if plant == "pp_not_summed":  # each stage sums its own ranks only (tp x dp of it)
            original = clip_grad.reduction_group
            clip_grad.reduction_group = lambda mesh: mesh.tp_group  # = a stage's 2 ranks here
            try:
                found = problems_of(spec)
            finally:
                clip_grad.reduction_group = original
        else:
            found = problems_of(spec, plant=plant)
        assert found, f"the planted mistake {plant} went unseen"

    return case


def norms_case():
    """inf, -inf, 1 and 3 norms against torch's on the dense model; a non-finite norm raises with
    error_if_nonfinite on every rank, and scales by NaN without it, as torch does."""
    minipar.init()
    spec = LAYOUTS["dp1_tp2_pp2_tied"]
    _, part, mesh = step_once(spec)  # clipped once already: the norms of the clipped grads
    dense = part.dense_grads()
    for p in (math.inf, -math.inf, 1.0, 3.0):
        got = clip_grad.total_norm(part.parameters(), p, mesh).item()
        each = torch.stack([torch.linalg.vector_norm(g, p) for g in dense.values()])
        want = torch.linalg.vector_norm(each, p).item()
        assert abs(got - want) <= 1e-5 * want, (p, got, want)
    for bad in (0, -1.0, float("nan")):
        try:
            clip_grad_norm_(part.parameters(), 1.0, bad, mesh=mesh)
        except ValueError as error:
            assert "norm_type" in str(error) and str(float(bad)) in str(error), error
        else:
            raise AssertionError(f"norm_type={bad} was taken")
    q = part.parameters()[0]
    q.grad.view(-1)[0] = float("nan")  # on every rank: each holds some piece
    try:
        clip_grad_norm_(part.parameters(), 1.0, mesh=mesh, error_if_nonfinite=True)
    except RuntimeError as error:
        assert "non-finite" in str(error)
    else:
        raise AssertionError("a NaN gradient did not raise")
    norm = clip_grad_norm_(part.parameters(), 1.0, mesh=mesh)
    assert math.isnan(norm.item()) and all(q.grad.isnan().all() for q in part.parameters())


def plain_block(mesh):
    """(dense, part, x): a plain torch.nn.LayerNorm beside Column/RowParallelLinear cut from the
    dense block on mesh.tp_group, and 8 input rows (the same on every rank)."""
    torch.manual_seed(0)
    dense = torch.nn.Sequential(
        torch.nn.LayerNorm(16), torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)
    )
    part = torch.nn.Sequential(
        copy.deepcopy(dense[0]),
        ColumnParallelLinear.from_dense(dense[1], mesh.tp_group),
        torch.nn.GELU(),
        RowParallelLinear.from_dense(dense[3], mesh.tp_group),
    )
    return dense, part, torch.randn(8, 16, generator=torch.Generator().manual_seed(1))


def plain_modules_case():
    """Issue 56: the block above on dp 2 x tp 2, its gradients averaged over dp by hand (as
    exercise 05 does), nothing marked by the user: the norm and the clipped gradients are
    torch.nn.utils.clip_grad_norm_'s on the dense block (counting the LayerNorm on every rank
    made the norm sqrt(2) too large)."""
    minipar.init()
    mesh = DeviceMesh(dp=2, tp=2, pp=1)
    dense, part, x = plain_block(mesh)
    rows = slice(4 * mesh.dp_rank, 4 * mesh.dp_rank + 4)
    part(x[rows]).square().mean().backward()
    for q in part.parameters():
        minipar.all_reduce(q.grad, group=mesh.dp_group)
        q.grad /= mesh.dp
    dense(x).square().mean().backward()
    want = torch.nn.utils.clip_grad_norm_(dense.parameters(), MAX_NORM)
    got = clip_grad_norm_(part.parameters(), MAX_NORM, mesh=mesh)
    assert abs(got.item() - want.item()) <= NORM_RTOL * want.item(), (got.item(), want.item())
    t, n = mesh.tp_rank, mesh.tp
    cut = {  # each part's piece of the dense gradient (plan.py's contiguous slices)
        "0.weight": lambda g: g, "0.bias": lambda g: g,
        "1.weight": lambda g: g.chunk(n, 0)[t], "1.bias": lambda g: g.chunk(n, 0)[t],
        "3.weight": lambda g: g.chunk(n, 1)[t], "3.bias": lambda g: g,
    }  # fmt: skip
    ref = dict(dense.named_parameters())
    for name, q in part.named_parameters():
        torch.testing.assert_close(q.grad, cut[name](ref[name].grad), rtol=1e-4, atol=1e-7)


def ambiguous_case():
    """Marks that leave a copy's ranks open raise on every rank, saying what to mark: the
    column layer without a mesh (cut over 2 of the 4 ranks of the default group), experts cut
    over ep = 2 of dp = 4 with their expert_dp mark gone; a rank whose own parameters are fine
    is told another rank's are not (and nobody waits)."""
    minipar.init()
    mesh = DeviceMesh(dp=2, tp=2, pp=1)
    _, part, x = plain_block(mesh)
    part(x).square().mean().backward()
    params = list(part.parameters())
    for held, said in ((params, "pass mesh="), (params if mesh.rank == 0 else params[:2], None)):
        try:
            clip_grad_norm_(held, MAX_NORM)
        except replicas.AmbiguousCopies as error:
            text = str(error)
        else:
            raise AssertionError("marks with no place for the copies were taken")
        if said or mesh.rank == 0:
            assert "pass mesh=" in text and "mark_replicated" in text, text
            assert "sharded over ranks" in text and "(16, 16)" in text, text
        else:
            assert "another rank" in text, text
    spec = LAYOUTS["dp4_moe_ep2"]
    moe_mesh = training.mesh_for(spec)
    chunk = mesh_model.MeshGPT(spec, moe_mesh)
    for q in chunk.parameters():
        q.grad = torch.ones_like(q)
        if getattr(q, "expert_parallel", False):
            setattr(q, replicas.ATTRIBUTE, ())  # the expert_dp mark forgotten
    try:
        clip_grad_norm_(chunk.parameters(), MAX_NORM, mesh=moe_mesh)
    except replicas.AmbiguousCopies as error:
        assert "expert_dp_group" in str(error) and "of the dp x cp line" in str(error), error
    else:
        raise AssertionError("experts over part of the dp line with no copies' group were taken")


FP16 = dataclasses.replace(
    spec_of(1, 2, 2), dtype="fp16", clip=1.0, warmup=1, lr_schedule="cosine", steps=2
)


def precision_problems(spec, unscale=None):
    """fp16 or bf16 with clip and schedule on the mesh (`unscale`: a planted training.unscale)
    against the dense twin: the problems (every rank gets rank 0's list; the dense run on rank
    0), and lesson 01's 16 bytes per parameter measured on every rank."""
    mesh = training.mesh_for(spec)
    stats, original = {}, training.unscale
    training.unscale = unscale or original
    try:
        losses, part, opt = training.train_on_mesh(spec, mesh, stats=stats)
    finally:
        training.unscale = original
    held = state_bytes(part.parameters(), opt, precision.dtype_of(spec.dtype))  # lesson 01's 16
    assert [held[k] for k in ("weights", "grads", "master", "m", "v", "total")] == [
        4,
        4,
        0,
        4,
        4,
        16,
    ], held
    assert 0 < held["compute_copies"] <= 2, held  # 16-bit copies of the matmul weights
    state = training.dense_state(part, mesh)
    found = []
    if mesh.rank == 0:
        ref_stats = {}
        reference, dense, _ = training.train_dense(spec, stats=ref_stats)
        tol = training.tolerances(spec)
        found += training.compare_norms(stats, ref_stats, tol["norm"])
        found += training.compare(losses, reference, state, dense.state_dict(), tol["loss"],
                                  tol["loss_atol"], tol["params"])  # fmt: skip
        if stats["scaler"] != ref_stats["scaler"]:
            found.append(f"loss scaler {stats['scaler']} vs dense {ref_stats['scaler']}")
    return mesh.group.allgather_object(found)[0]


BF16 = dataclasses.replace(FP16, dp=2, tp=2, pp=1, dtype="bf16", reduce_dtype="bf16")


def fp16_case():
    minipar.init()
    found = precision_problems(FP16)
    assert not found, "; ".join(found)


def bf16_case():
    """bf16 compute, DDP's gradients reduced in bf16, clip and schedule: the dense twin's run
    within training.tolerances' bound."""
    minipar.init()
    found = precision_problems(BF16)
    assert not found, "; ".join(found)


def scale_not_undone_case():
    """The planted mistake: the clip reads the gradients still multiplied by the loss scale."""
    minipar.init()
    found = precision_problems(FP16, lambda scaler, params: True)  # the norm 2^16 times too large
    assert any("gradient norm" in p for p in found), found


def overflow_case():
    """One rank's inf: every rank's unscale_ says False and every scale halves."""
    comm = minipar.init()
    mesh = training.mesh_for(RunSpec(1, 2, 2, model=TINY))
    scaler = LossScaler(init_scale=8.0, mesh=mesh)
    q = torch.nn.Parameter(torch.ones(3))
    q.grad = torch.full((3,), 8.0)
    if comm.rank == 3:
        q.grad[1] = float("inf")
    assert scaler.unscale_([q]) is False
    scaler.update()
    assert scaler.scale == 4.0 and torch.equal(q.grad[0], torch.tensor(1.0))
    q.grad = torch.full((3,), 4.0)
    assert scaler.unscale_([q]) is True
    scaler.update()
    assert scaler.scale == 4.0 and scaler.good_steps == 1


def reduce_bytes_case():
    """DDP with reduce_dtype=bf16 sends half the gradient bytes of fp32 (the ledger)."""
    minipar.init()
    sent = {}
    for dtype in (None, torch.bfloat16):
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(256, 256), reduce_dtype=dtype)
        x = torch.randn(4, 256) * (1 + minipar.get_rank())
        with minipar.trace() as t:
            model(x).square().sum().backward()
        sent[dtype] = t.bytes_sent("all_reduce")
        assert model.module.weight.grad.dtype == torch.float32
    ratio = sent[torch.bfloat16] / sent[None]
    assert abs(ratio - 0.5) < 0.01, (sent, ratio)


def data_parallel_case():
    """DDP + ZeRO-1 and FSDP on the world (a two-layer net): the norm is torch's on the dense
    net's averaged gradient, ZeRO-1's step after the clip is the dense AdamW step after
    torch's clip, and FSDP's reduce_dtype=bf16 halves its reduce-scatter's bytes."""
    minipar.init()
    p, rank = minipar.get_world_size(), minipar.get_rank()

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

    xs = torch.randn(p * 2, 16, generator=torch.Generator().manual_seed(1))
    dense = net()
    dense(xs).square().mean().backward()
    want = torch.nn.utils.clip_grad_norm_(dense.parameters(), 0.1)
    torch.optim.AdamW(dense.parameters(), lr=0.1).step()
    model = DistributedDataParallel(net())
    zero = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=0.1)
    model(xs[rank * 2 : rank * 2 + 2]).square().mean().backward()
    got = clip_grad_norm_(model.parameters(), 0.1)
    assert abs(got.item() - want.item()) <= 1e-5 * want.item(), (got, want)
    zero.step()
    for mine, ref in zip(model.module.parameters(), dense.parameters()):
        assert torch.allclose(mine, ref, atol=1e-6), (mine - ref).abs().max()
    held = state_bytes(model.parameters(), zero)  # ZeRO-1 divides m and v over the ranks:
    moments = minipar.init().allgather_object(held["m"] + held["v"])  # 8 bytes in all
    assert held["weights"] == held["grads"] == 4 and abs(sum(moments) - 8) < 1e-9, moments
    sent = {}
    for dtype in (None, torch.bfloat16):
        fsdp = FullyShardedDataParallel(net(), reduce_dtype=dtype)
        with minipar.trace() as t:
            fsdp(xs[rank * 2 : rank * 2 + 2]).square().mean().backward()
        sent[dtype] = t.bytes_sent("reduce_scatter")
        norm = clip_grad_norm_(fsdp.parameters(), 0.1)
        assert abs(norm.item() - want.item()) <= 1e-2 * want.item(), (dtype, norm, want)
    assert sent[torch.bfloat16] * 2 == sent[None], sent


def cases(size):
    if size != 4:
        return {}
    table = {f"layout.{name}": layout_case(name) for name in LAYOUTS}
    table.update({f"plant.{name}": plant_case(name) for name in PLANTS})
    table["norms"] = norms_case
    table["plain_modules.dp2_tp2"] = plain_modules_case
    table["plain_modules.ambiguous"] = ambiguous_case
    table["fp16.tp2_pp2"] = fp16_case
    table["bf16.dp2_tp2_reduce_bf16"] = bf16_case
    table["plant.scale_not_undone"] = scale_not_undone_case
    table["fp16.overflow_on_one_rank"] = overflow_case
    table["ddp.reduce_bf16_half_bytes"] = reduce_bytes_case
    table["ddp_zero1_fsdp.clip"] = data_parallel_case
    return table
