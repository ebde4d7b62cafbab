"""The tiny GPT trained on real DeviceMesh layouts (run by tests/test_gpt_mesh.py, one launch per
world size): every layout of 8 ranks with dp, tp, pp in {1, 2, 4, 8}, each rebuilding the mesh
and training 2 steps, checked against the dense single-process run.

- layout.dpD_tpT_ppP: the first step's synchronised gradients, every parameter gathered back to
  the dense layout, equal the dense model's on the whole batch within GRAD_RTOL (AdamW divides
  a gradient off by a constant factor out of the weights, so only this sees a wrong divisor);
  the loss of every step equals the dense run's within |a - b| <= 1e-5 + 1e-4 |b| (float32; TP
  and DP sum in another order), on every rank; the dense state gathered from the layout equals
  the dense run's final weights within PARAMS_REL / PARAMS_MAX. Every layout but dp = 8 runs 2
  micro-batches per dp rank (4 at dp=2 tp=4), so pp = 1 accumulates gradients over them;
- tied.*: a tied head (pp > 1: copies on the first and last stage, gradients summed);
- fsdp.*: FullyShardedDataParallel as the data-parallel part (with a pipeline and TP);
- hsdp.*: hybrid sharding (FSDP inside groups of dp_shard dp ranks, replicated across them);
- resume.*: a checkpoint (weights and AdamW state) saved on one layout, loaded on another,
  continues with the uninterrupted dense run's losses (FSDP: its shards gathered and re-cut),
  and the first step of each part has the dense model's gradients;
- cp.* / moe.*: context parallelism (ring and Ulysses, cp = 2) and MoE blocks (ep = 2 with
  dp = 2 and dp = 4; with cp, tp and a pipeline too) against the dense GPT (every expert
  local, the same routing, dropless);
- errors: product mismatch, heads or layers not divisible: the same ValueError on every rank.

The 4-rank layouts run two at a time, each on one half of the 8-rank world (a mesh on a
sub-group), the 2-rank ones four at a time on its quarters, so one launch covers every size.
The dense reference runs on each mesh's rank 0 only (cached per configuration): the other ranks
would only repeat it on the same two cores.
"""

import dataclasses
import functools
import os
import tempfile

import gpt_recompute  # the recomputation, memory and trace cases, run in this launch
import pytest
import torch

import minipar
from minipar.models import checkpoint, training
from minipar.models.config import GPTConfig, RunSpec
from minipar.parallel import DeviceMesh

# 8 heads and 8 layers: tp and pp up to 8 divide; hidden 32, 16 positions keep 8 ranks on 2 cores.
# A layout that does not need 8 layers (pp <= 4; interleaved at pp = 2) trains SHORT's 4: half
# the blocks, the same calls per block (measured: the cases 37.6 -> 26.3 s on 8 ranks)
TINY = GPTConfig(seq_len=16, hidden=32, n_layers=8, n_heads=8)
SHORT = dataclasses.replace(TINY, n_layers=4)
STEPS = 2  # the second step starts from the first one's AdamW update: a wrong update shows
LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-5
# AdamW moves every element by about lr whatever its gradient's size, so an element whose
# gradient is at rounding level can land up to ~lr away after a step: compare each tensor as a
# whole (relative L2) plus a bound on any single element
PARAMS_REL, PARAMS_MAX = 1e-3, 3e-3
# gradients of step 0 against the dense model's on the whole batch: each tensor within GRAD_RTOL
# of its largest element (float32 sums in another order: under 1e-6 seen)
GRAD_RTOL = 1e-4


def layouts(size):
    """Every (dp, tp, pp) with degrees in {1, 2, 4, 8} and product `size`."""
    degrees = (1, 2, 4, 8)
    return [(d, t, p) for d in degrees for t in degrees for p in degrees if d * t * p == size]


def spec_for(
    dp, tp, pp, tied=False, schedule="1f1b", steps=STEPS, fsdp=False, m=None, cp=1,
    variant="ring", experts=0, ep=1,
):  # fmt: skip
    """The run of a layout: m micro-batches per dp rank (batch 8 = dp x m x rows; default 2,
    accumulated one after the other when pp = 1, 1 at dp = 8)."""
    m = m or (2 if dp < 8 else 1)
    chunks = 2 if schedule == "interleaved" else 1
    base = SHORT if pp * chunks <= SHORT.n_layers else TINY
    model = dataclasses.replace(base, tied_head=tied, n_experts=experts)
    return RunSpec(dp, tp, pp, m, schedule, fsdp, steps=steps, model=model, cp=cp,
                   cp_variant=variant, ep=ep)  # fmt: skip


@functools.cache
def dense_run(model, steps, microbatches=1, start=0):
    """(losses, final state) of the dense run."""
    spec = RunSpec(microbatches=microbatches, steps=start + steps, model=model)
    losses, dense, _ = training.train_dense(spec)
    return losses, {k: v.detach().clone() for k, v in dense.state_dict().items()}


@functools.cache
def dense_grads(model, step=0):
    return training.dense_gradients(RunSpec(model=model), None, step)


def check_grads(grads, reference, what):
    """The step's synchronised gradients, gathered back to the dense layout, against the dense
    model's on the whole batch (AdamW divides a uniform scale error out of the weights)."""
    problems = training.compare_gradients(grads, reference, GRAD_RTOL)
    assert not problems, f"{what}: " + "; ".join(problems)


def check_against_dense(spec, losses, state, what, grads=None):
    ref_losses, ref_state = dense_run(spec.model, spec.steps)
    if grads is not None:
        check_grads(grads, dense_grads(spec.model), what)
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= LOSS_ATOL + LOSS_RTOL * abs(b), f"{what} step {step}: {a} vs {b}"
    assert set(state) == set(ref_state), what
    for name, ref in ref_state.items():
        diff = (state[name] - ref).abs()
        rel = (diff.norm() / ref.norm().clamp_min(1e-12)).item()
        assert rel <= PARAMS_REL and diff.max() <= PARAMS_MAX, (what, name, rel, diff.max())


def first_grads(into):
    """An on_grads hook keeping the first step's gradients, gathered dense (every rank)."""

    def hook(step, part):
        if not into:
            into.update(part.dense_grads())

    return hook


def train_layout(spec, group=None):
    """Train `spec` on a mesh over `group`; (losses, gathered dense state, the first step's
    dense gradients, the group's comm)."""
    mesh = training.mesh_for(spec, group)
    grads = {}
    losses, part, _ = training.train_on_mesh(spec, mesh, on_grads=first_grads(grads))
    return losses, training.dense_state(part, mesh), grads, mesh.group


def check_layout(spec, group=None):
    losses, state, grads, comm = train_layout(spec, group)
    assert len(losses) == spec.steps
    # every rank reports the same loss (broadcast from the last stage)
    seen = comm.allgather_object(losses)
    assert all(other == losses for other in seen), seen
    if comm.rank == 0:
        what = f"{spec.layout} m={spec.microbatches}"
        check_against_dense(spec, losses, state, what, grads)


def layout_case(spec):
    def case():
        minipar.init()
        check_layout(spec)

    return case


@functools.cache
def parts(n):
    """The world cut into n equal parts as groups (every rank creates all; each is in one);
    returns (this rank's part, its index)."""
    size = minipar.init().size
    width = size // n
    made = [minipar.new_group(list(range(i * width, (i + 1) * width))) for i in range(n)]
    mine = minipar.get_rank() // width
    return made[mine], mine


def halves_case(first, second):
    """Two meshes of half the world at once: ranks 0..n/2-1 train `first`, the rest `second`."""
    return parts_case(first, second)


def parts_case(*specs):
    """len(specs) meshes side by side, each on its part of the world."""

    def case():
        minipar.init()
        group, index = parts(len(specs))
        check_layout(specs[index], group)

    return case


def shared_path(name):
    """A file name every rank agrees on (rank 0's temporary folder)."""
    comm = minipar.init()
    folder = tempfile.mkdtemp(prefix="minipar-gpt-") if comm.rank == 0 else None
    return os.path.join(comm.allgather_object(folder)[0], name)


def resume_case(first, second, tied=False, fsdp=False):
    """Train 2 steps on layout `first`, save; load on layout `second` and train 2 more (both
    with FSDP as the data-parallel part if `fsdp`)."""

    def case():
        comm = minipar.init()
        path = shared_path("ckpt.pt")
        a = spec_for(*first, tied=tied, steps=2, fsdp=fsdp)
        mesh = DeviceMesh(*first)
        grads = {}
        losses, part, opt = training.train_on_mesh(a, mesh, on_grads=first_grads(grads))
        state = training.dense_state(part, mesh)
        optimizer = training.mesh_optimizer_state(part, opt)
        if comm.rank == 0:
            checkpoint.save(path, state, a.model, 2, optimizer)
        comm.allgather_object(None)  # the file is complete before anyone reads it
        model, start = checkpoint.load(path)
        opt_state = checkpoint.read(path)["optimizer"]
        b = spec_for(*second, tied=tied, steps=2, fsdp=fsdp)
        mesh = DeviceMesh(*second)
        resumed = {}
        more, _, _ = training.train_on_mesh(
            b, mesh, None, model, start, "cpu", opt_state, first_grads(resumed)
        )
        if comm.rank == 0:
            check_grads(grads, dense_grads(a.model), f"{first} step 0")
            ref = training.dense_gradients(b, model, start)
            check_grads(resumed, ref, f"{second} resumed at step {start}")
            reference = dense_run(a.model, 4)[0]
            both = losses + more
            for step, (x, y) in enumerate(zip(both, reference)):
                assert abs(x - y) <= LOSS_ATOL + LOSS_RTOL * abs(y), (step, both, reference)
            os.remove(path)
            os.rmdir(os.path.dirname(path))  # rank 0's folder from shared_path: nothing left

    return case


def expect_value_error(fn, *words):
    with pytest.raises(ValueError) as info:
        fn()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def errors():
    w = minipar.init()
    size = w.size
    bad = TINY
    # product mismatch: the mesh refuses before any group is built
    expect_value_error(lambda: DeviceMesh(size, 2, 1), f"dp={size} x tp=2 x pp=1", str(size))
    # heads not divisible by tp
    heads = dataclasses.replace(bad, n_heads=2, hidden=32)
    mesh = DeviceMesh(1, size, 1)
    spec = RunSpec(1, size, 1, model=heads)
    expect_value_error(lambda: training.train_on_mesh(spec, mesh), f"tp={size}", "n_heads=2")
    # layers not divisible by pp, and interleaving needing 2 chunks per rank
    layers = dataclasses.replace(bad, n_layers=6)
    mesh = DeviceMesh(1, 1, size)
    spec = RunSpec(1, 1, size, 1, "1f1b", model=layers)
    expect_value_error(lambda: training.train_on_mesh(spec, mesh), "n_layers=6", f"pp={size}")
    spec = RunSpec(1, 1, size, size, "interleaved", model=bad)
    if bad.n_layers % (2 * size):
        expect_value_error(lambda: training.train_on_mesh(spec, mesh), "virtual_stages=2")
    # FSDP cannot follow zb-h1's split backward, nor sum a tied head's shards across stages
    mesh = DeviceMesh(size // 2, 1, 2)
    spec = RunSpec(size // 2, 1, 2, 2, "zb-h1", True, batch_size=size, model=bad)
    expect_value_error(lambda: training.train_on_mesh(spec, mesh), "--fsdp", "zb-h1")
    tied = dataclasses.replace(bad, tied_head=True)
    spec = RunSpec(size // 2, 1, 2, 2, "1f1b", True, batch_size=size, model=tied)
    expect_value_error(lambda: training.train_on_mesh(spec, mesh), "--fsdp", "tied head")
    # and the world still works afterwards: nothing was left in flight
    x = torch.ones(2)
    minipar.all_reduce(x)
    assert (x == size).all()


def cases(size):
    table = {}
    for dp, tp, pp in layouts(size):
        schedule = "gpipe" if (dp, tp, pp) == (2, 1, 4) else "1f1b"
        m = 4 if (dp, tp, pp) == (2, 4, 1) else None  # accumulation over 4 micro-batches
        spec = spec_for(dp, tp, pp, schedule=schedule, m=m)
        table[f"layout.dp{dp}_tp{tp}_pp{pp}"] = layout_case(spec)
    table["interleaved.dp2_tp2_pp2"] = layout_case(spec_for(2, 2, 2, schedule="interleaved"))
    table["tied.dp1_tp2_pp4"] = layout_case(spec_for(1, 2, 4, tied=True))
    # 4-rank layouts, two at a time on the halves of the world
    four = [
        (spec_for(1, 2, 2, tied=True), spec_for(2, 1, 2, schedule="zb-h1")),
        (spec_for(1, 4, 1), spec_for(1, 1, 4, tied=True)),
    ]
    for a, b in four:
        name = f"half.dp{a.dp}_tp{a.tp}_pp{a.pp}+dp{b.dp}_tp{b.tp}_pp{b.pp}"
        table[name] = halves_case(a, b)
    table["fsdp.dp2_tp2_pp2"] = layout_case(spec_for(2, 2, 2, fsdp=True))
    # context parallelism and mixtures of experts: 2-rank meshes four at a time, 4-rank ones
    # two at a time, then one of 8 with every axis
    table["quarter.cp2_ring+cp2_ulysses+moe.dp2_ep2+moe.dp2_ep1"] = parts_case(
        spec_for(1, 1, 1, cp=2),
        spec_for(1, 1, 1, cp=2, variant="ulysses"),
        spec_for(2, 1, 1, experts=4, ep=2),
        spec_for(2, 1, 1, experts=4, ep=1),
    )
    table["half.moe.dp4_ep2+moe.dp2_cp2_ep2_ulysses"] = parts_case(
        spec_for(4, 1, 1, experts=4, ep=2),
        spec_for(2, 1, 1, experts=4, ep=2, cp=2, variant="ulysses"),
    )
    table["moe.cp.dp2_cp2_pp2_ep2"] = layout_case(spec_for(2, 1, 2, cp=2, experts=4, ep=2))
    table["cp.dp2_cp2_tp2_fsdp"] = layout_case(spec_for(2, 2, 1, cp=2, fsdp=True))
    table["resume.fsdp.dp2_tp2_pp2_to_dp2_tp4_pp1"] = resume_case((2, 2, 2), (2, 4, 1), fsdp=True)
    # hybrid sharding: FSDP inside pairs of dp ranks, the gradient blocks all-reduced across
    hybrid = dataclasses.replace(spec_for(4, 2, 1, fsdp=True), dp_shard=2)
    table["hsdp.dp4_shard2_tp2"] = layout_case(hybrid)
    if os.environ.get("MINIPAR_EXTENDED") == "1":  # a few seconds each on 2 cores
        table["fsdp.tied.dp4_tp2_pp1"] = layout_case(spec_for(4, 2, 1, tied=True, fsdp=True))
        table["resume.tied.dp1_tp2_pp4_to_dp8"] = resume_case((1, 2, 4), (8, 1, 1), tied=True)
    table["errors"] = errors
    table.update(gpt_recompute.cases(size))
    return table
