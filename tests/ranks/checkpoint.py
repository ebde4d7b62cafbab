"""Sharded checkpoints on real meshes (run by tests/test_checkpoint.py: one launch of 4 ranks;
MINIPAR_EXTENDED=1 adds one of 8, the long checks CI also runs).

- reshard.A_to_B: a MeshGPT of layout A built from a seeded dense GPT (weights) and seeded dense
  AdamW moments (sliced by MeshGPT's own load_optimizer_state), saved sharded, loaded into
  layout B by the loader: the dense weights and moments B gathers (MeshGPT.dense_state /
  optimizer_state, collectives independent of the checkpoint code) are the seeded dense ones,
  bit for bit; so is the one-process load_dense. A rank reads only pieces of its own names: at
  an unchanged tp, 1/tp of a cut tensor. On 4 ranks, a ring of four: dp 2 x tp 2 -> tp 2 x pp
  2 interleaved -> dp 2 x pp 2 FSDP -> dp 4 hybrid (shard 2 x replicate 2) -> dp 2 x tp 2; the
  hybrid one also loaded at full FSDP dp 4 and at DDP dp 2 (2 ranks). A hybrid save writes each
  shard once: the ranks of the first replica hold every tensor on disk, the others none, and
  the tensors' bytes are 3 x 4 x the dense model's parameters. On 8: every layout of the 3D
  checks (tests/ranks/gpt_mesh.py: dp, tp, pp of 8, interleaved, FSDP, hybrid sharding, a tied
  head, cp, MoE with ep), saved once and loaded once in a ring of its family; dp 3 x tp 2 (6 of
  the 8 ranks) to dp 2 x tp 2 and to one process.
- resume.same: 4 steps straight against 2, a save, a load and 2 more on the same layout (dp 2 x
  pp 2, and dp 4 hybrid 2 x 2; on 8 ranks dp 2 x tp 2 x pp 2): the same losses and final
  weights, bitwise (the data order is a function of the step).
- resume.A_to_B (8 ranks): 2 steps on A, the checkpoint loaded on B with dp shrunk as a restart
  refits (dp 3 x tp 2 to dp 2 x tp 2; dp 2 x tp 2 to tp 2; hybrid 2 x 2 to full FSDP dp 2, a
  node lost) for 2 more: every loss and the final weights within the dense run's bounds (the
  dense twin of all 4).
- corrupt: a truncated shard, a missing manifest, a flipped byte: never loaded, the one before
  is, and the message names what was wrong; prune keeps the newest N whole.
"""

import dataclasses
import functools
import os
import shutil
import tempfile

import torch

import minipar
from minipar.models import checkpoint_files, checkpoint_loader, training
from minipar.models.checkpoint_saver import ShardedSaver
from minipar.models.config import GPTConfig, RunSpec
from minipar.models.gpt import build_gpt
from minipar.models.mesh_model import MeshGPT

TINY = GPTConfig(seq_len=16, hidden=32, n_layers=8, n_heads=8)
LOSS_RTOL, LOSS_ATOL, PARAMS_REL, PARAMS_MAX = 1e-4, 1e-5, 1e-3, 3e-3  # as gpt_mesh.py's


@functools.cache
def group_of(n: int):
    """A group of the first n ranks (every rank makes it; None for ranks outside it)."""
    world = minipar.init()
    made = minipar.new_group(list(range(n)))
    return made if world.rank < n else None


def shared_dir() -> str:
    comm = minipar.init()
    folder = tempfile.mkdtemp(prefix="minipar-ckpt-") if comm.rank == 0 else None
    return comm.allgather_object(folder)[0]


def spec_for(dp=1, tp=1, pp=1, cp=1, ep=1, fsdp=False, schedule="1f1b", tied=False, experts=0,
             shard=0):  # fmt: skip
    """A layout of the tiny GPT; shard K: hybrid sharding, FSDP inside runs of K dp ranks."""
    model = dataclasses.replace(TINY, tied_head=tied, n_experts=experts)
    return RunSpec(dp, tp, pp, 2 if pp > 1 else 1, schedule, fsdp or shard > 0, steps=2,
                   model=model, cp=cp, ep=ep, dp_shard=shard)  # fmt: skip


@functools.cache
def seeded(config):
    """The dense weights and AdamW moments every layout starts from, made without any mesh."""
    model = build_gpt(config, seed=7)
    g = torch.Generator().manual_seed(11)
    states = {
        name: {
            "exp_avg": torch.randn(q.shape, generator=g),
            "exp_avg_sq": torch.rand(q.shape, generator=g),
            "step": torch.tensor(3.0),
        }
        for name, q in model.named_parameters()
    }
    return model, states


def build(spec, group, model, states):
    """Layout `spec` on `group` from a dense model and dense AdamW state (MeshGPT's own slicing)."""
    mesh = training.mesh_for(spec, group)
    part = MeshGPT(spec, mesh, model)
    opt = training.make_optimizer_for(part.parameters(), spec.lr)
    part.load_optimizer_state(opt, states)
    return mesh, part, opt


def expect_equal(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want), (what, sorted(set(got) ^ set(want)))
    for name, ref in want.items():
        if isinstance(ref, dict):
            expect_equal(got[name], ref, f"{what} {name}")
        else:
            assert torch.equal(got[name].float(), ref.float()), (what, name)


def reshard(first, second, n_first=None, n_second=None):
    """Save layout `first` (on the first n_first ranks, default all), load it into `second`."""

    def case():
        comm = minipar.init()
        root = shared_dir()
        try:
            _reshard(comm, root, first, second, n_first, n_second)
        finally:  # a failing case leaves nothing behind either
            if comm.rank == 0:
                shutil.rmtree(root, ignore_errors=True)

    return case


def _reshard(comm, root, first, second, n_first, n_second):
    n_first, n_second = n_first or comm.size, n_second or comm.size
    model, states = seeded(first.model)
    folder = checkpoint_files.step_dir(root, 3)
    group = group_of(n_first)
    if group is not None:
        mesh, part, opt = build(first, group, model, states)
        saver = ShardedSaver(root, mesh, first, keep=1, blocking=True)
        saver.save(3, part, opt, {"note": "test"})
        saver.finish()
        assert not saver.errors, saver.errors
        if 0 < first.dp_shard < first.dp:
            written_once(folder, first, mesh, model)
    comm.allgather_object(None)  # the manifest is on disk before anyone looks
    whole, manifest = checkpoint_files.problem(folder)
    assert whole is None, whole
    group = group_of(n_second)
    if group is not None:
        mesh = training.mesh_for(second, group)
        dense, opt_state, step, extra = checkpoint_loader.load_for_mesh(
            folder, manifest, second, mesh
        )
        assert step == 3 and extra["note"] == "test" and extra["adam_step"] == 3.0
        _, part, opt = build(second, group, dense, opt_state)
        got, got_opt = part.dense_state(), part.optimizer_state(opt)
        if mesh.group.rank == 0:
            expect_equal(got, model.state_dict(), f"{second.layout} weights")
            expect_equal(got_opt, states, f"{second.layout} AdamW")
        if second.tp == first.tp and first.tp > 1 and not first.fsdp:
            total = sum(4 * t.numel() for t in model.state_dict().values()) * 3  # w, m, v
            assert extra["bytes_read"] < total, (extra["bytes_read"], total)
    if comm.rank == 0:
        state, opt_state = checkpoint_loader.load_dense(folder)
        expect_equal(state, model.state_dict(), "load_dense weights")
        expect_equal(opt_state, states, "load_dense AdamW")
    comm.allgather_object(None)  # every rank done with the files


def written_once(folder, spec, mesh, model):
    """Hybrid sharding: each shard's R copies written once, by the ranks of the first run of
    shard ranks (dp rank < dp_shard); the others' files hold nothing. The tensors on disk are
    the dense model's weights, exp_avg and exp_avg_sq once: 3 x 4 bytes a parameter (fp32),
    not R times that; the files' own bytes (zip and pickle) add little to it. Every rank checks
    (a few MB read), so a wrong save fails on all of them at once."""
    ranks = mesh.group.allgather_object((mesh.group.rank, mesh.dp_rank))  # collective
    payload, on_disk = 0, 0
    for rank, dp_rank in ranks:
        path = os.path.join(folder, checkpoint_files.shard_name(rank) + ".pt")
        tensors = torch.load(path, weights_only=True)
        assert bool(tensors) == (dp_rank < spec.dp_shard), (rank, dp_rank, sorted(tensors)[:3])
        payload += sum(t.numel() * t.element_size() for t in tensors.values())
        on_disk += os.path.getsize(path)
    once = 3 * 4 * sum(q.numel() for q in model.parameters())  # a tied head counted once
    assert payload == once, (payload, once, spec.dp // spec.dp_shard)
    assert on_disk < 1.5 * once, (on_disk, once)  # R >= 2 copies: at least 2 x once


FAMILIES = {  # each saved by one and loaded by the next, round the ring
    "plain": [
        spec_for(dp=4, tp=2), spec_for(dp=2, tp=2, pp=2, fsdp=True),
        spec_for(dp=2, pp=4, schedule="interleaved"), spec_for(tp=8),
        spec_for(dp=2, cp=2, tp=2, fsdp=True), spec_for(dp=2, tp=2, pp=2),
    ],
    "tied": [spec_for(tp=2, pp=4, tied=True), spec_for(dp=4, tp=2, fsdp=True, tied=True)],
    "moe": [spec_for(dp=4, tp=2, ep=2, experts=4), spec_for(dp=2, cp=2, pp=2, ep=2, experts=4)],
}  # fmt: skip
# MINIPAR_EXTENDED=1: the other layouts of the 3D checks, and one more of each family
EXTENDED_FAMILIES = {
    "plain": [
        spec_for(dp=8), spec_for(tp=4, pp=2), spec_for(pp=8), spec_for(dp=2, tp=4),
        spec_for(dp=4, pp=2, fsdp=True), spec_for(dp=4, cp=2), spec_for(dp=4, pp=2, shard=2),
    ],
    "tied": [spec_for(dp=2, tp=2, pp=2, tied=True), spec_for(tp=2, pp=4, tied=True),
             spec_for(dp=4, tp=2, shard=2, tied=True)],
    "moe": [spec_for(dp=8, ep=4, experts=4), spec_for(dp=4, tp=2, ep=2, experts=4)],
}  # fmt: skip


def name_of(spec) -> str:
    parts = [f"{k}{getattr(spec, k)}" for k in ("dp", "cp", "tp", "pp", "ep")]
    parts = [p for p in parts if not p.endswith("1") or p in ("dp1",)]
    hybrid = 0 < spec.dp_shard < spec.dp
    extra = [f"hsdp{spec.dp_shard}" if hybrid else "fsdp"] * spec.fsdp
    extra += ["interleaved"] * (spec.schedule == "interleaved")
    return "_".join(parts + extra + ["tied"] * spec.model.tied_head)


def train_segment(spec, group, steps, start=0, model=None, opt_state=None):
    mesh = training.mesh_for(dataclasses.replace(spec, steps=steps), group)
    run = dataclasses.replace(spec, steps=steps)
    return mesh, *training.train_on_mesh(run, mesh, None, model, start, "cpu", opt_state)


def resume_case(first, second, n_first, n_second, bitwise):
    """2 steps on `first`, saved; 2 more on `second` from the checkpoint; against 4 straight
    on `first` (bitwise) or the dense twin of all 4 (within gpt_mesh.py's bounds)."""

    def case():
        comm = minipar.init()
        root = shared_dir()
        try:
            _resume(comm, root, first, second, n_first, n_second, bitwise)
        finally:  # a failing case leaves nothing behind either
            if comm.rank == 0:
                shutil.rmtree(root, ignore_errors=True)

    return case


def _resume(comm, root, first, second, n_first, n_second, bitwise):
    group, losses = group_of(n_first), None
    if group is not None:
        mesh, losses, part, opt = train_segment(first, group, 2)
        saver = ShardedSaver(root, mesh, first, keep=1)  # in a thread, as in training
        saver.save(2, part, opt, {})
        saver.finish()
    losses = comm.allgather_object(losses)[0]  # also: the manifest is on disk
    folder, manifest = checkpoint_loader.choose(root, comm)
    assert folder == checkpoint_files.step_dir(root, 2), folder
    group = group_of(n_second)
    if group is not None:
        mesh = training.mesh_for(second, group)
        dense, opt_state, start, _ = checkpoint_loader.load_for_mesh(folder, manifest, second, mesh)
        _, more, part, _ = train_segment(second, group, 2, start, dense, opt_state)
        state, both = part.dense_state(), losses + more
        if bitwise:
            _, straight, whole, _ = train_segment(first, group, 4)
            assert both == straight, (both, straight)
            expect_equal(state, whole.dense_state(), "resumed against straight")
        elif mesh.group.rank == 0:
            check_dense(first, both, state)
    comm.allgather_object(None)  # every rank done with the files


def check_dense(spec, losses, state):
    """Every loss and the final weights against the dense twin's run of as many steps."""
    spec = dataclasses.replace(spec, dp=1, tp=1, pp=1, steps=len(losses), microbatches=1)
    ref, dense_model, _ = training.train_dense(spec)
    for step, (a, b) in enumerate(zip(losses, ref)):
        assert abs(a - b) <= LOSS_ATOL + LOSS_RTOL * abs(b), (step, losses, ref)
    for name, want in dense_model.state_dict().items():
        diff = (state[name] - want).abs()
        rel = (diff.norm() / want.norm().clamp_min(1e-12)).item()
        assert rel <= PARAMS_REL and diff.max() <= PARAMS_MAX, (name, rel)


def corrupt():
    """Three whole checkpoints saved on one rank; each newer one broken in its own way."""
    comm = minipar.init()
    group = group_of(1)
    if group is None:
        return
    root = tempfile.mkdtemp(prefix="minipar-ckpt-")
    try:
        spec = spec_for()
        model, states = seeded(spec.model)
        mesh, part, opt = build(spec, group, model, states)
        saver = ShardedSaver(root, mesh, spec, keep=3, blocking=True)
        for step in (1, 2, 3, 4):
            saver.save(step, part, opt, {})
        assert checkpoint_files.steps(root) == [2, 3, 4]  # keep 3: step 1 pruned
        shard = os.path.join(checkpoint_files.step_dir(root, 4), "shard-00000.pt")
        with open(shard, "r+b") as f:  # one flipped byte in the newest
            f.seek(os.path.getsize(shard) // 2)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0x01]))
        folder, _, passed = checkpoint_files.newest_whole(root)
        assert folder == checkpoint_files.step_dir(root, 3), folder
        assert "shard-00000.pt: sha256 differs" in passed[0] and "step-00000004" in passed[0]
        shard = os.path.join(checkpoint_files.step_dir(root, 3), "shard-00000.pt")
        os.truncate(shard, os.path.getsize(shard) - 100)  # a truncated one before it
        os.remove(os.path.join(checkpoint_files.step_dir(root, 2), "manifest.json"))
        folder, manifest, passed = checkpoint_files.newest_whole(root)
        assert folder is None and manifest is None, folder
        assert "truncated" in passed[1] and "step-00000003" in passed[1], passed
        assert "no manifest.json" in passed[2] and "step-00000002" in passed[2], passed
        saver.save(5, part, opt, {})  # a new whole one: found, and the broken ones pruned?
        folder, _, passed = checkpoint_files.newest_whole(root)
        assert folder == checkpoint_files.step_dir(root, 5) and not passed
        try:
            checkpoint_loader.load_dense(checkpoint_files.step_dir(root, 3))
        except ValueError as error:
            assert "truncated" in str(error), error
        else:
            raise AssertionError("a truncated checkpoint was loaded")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        del comm


# the default cases, on 4 ranks: dp x tp, pp (interleaved), FSDP, each saved and loaded once
QUICK_RING = [spec_for(dp=2, tp=2), spec_for(tp=2, pp=2, schedule="interleaved"),
              spec_for(dp=2, pp=2, fsdp=True), spec_for(dp=4, shard=2)]  # fmt: skip
HYBRID = spec_for(dp=4, shard=2)  # hybrid sharding: 2 shards, each on 2 replicas


def cases(size):
    if size == 4:
        return quick_cases()
    if size == 8:
        return extended_cases()
    return {}


def quick_cases():
    table = {}
    for a, b in zip(QUICK_RING, QUICK_RING[1:] + QUICK_RING[:1]):
        table[f"reshard.plain.{name_of(a)}_to_{name_of(b)}"] = reshard(a, b)
    table["reshard.hybrid.dp4_hsdp2_to_dp4_fsdp"] = reshard(HYBRID, spec_for(dp=4, fsdp=True))
    table["reshard.hybrid.dp4_hsdp2_to_dp2"] = reshard(HYBRID, spec_for(dp=2), None, 2)
    same = spec_for(dp=2, pp=2)
    table["resume.same.dp2_pp2"] = resume_case(same, same, 4, 4, bitwise=True)
    table["resume.same.dp4_hsdp2"] = resume_case(HYBRID, HYBRID, 4, 4, bitwise=True)
    table["corrupt"] = corrupt
    return table


def extended_cases():
    """MINIPAR_EXTENDED=1, on 8 ranks: every layout of the 3D checks in its family's ring, dp 3
    x tp 2 (6 ranks) to dp 2 x tp 2 and to one process, the resumes with dp shrunk."""
    table = {}
    for group in (FAMILIES, EXTENDED_FAMILIES):
        for family, specs in group.items():
            for a, b in zip(specs, specs[1:] + specs[:1]):
                table[f"reshard.{family}.{name_of(a)}_to_{name_of(b)}"] = reshard(a, b)
    table["reshard.dp3_tp2_to_dp2_tp2"] = reshard(spec_for(dp=3, tp=2), spec_for(dp=2, tp=2), 6, 4)
    table["reshard.dp3_tp2_to_dense"] = reshard(spec_for(dp=3, tp=2), spec_for(), 6, 1)
    same = spec_for(dp=2, tp=2, pp=2)
    table["resume.same.dp2_tp2_pp2"] = resume_case(same, same, 8, 8, bitwise=True)
    table["resume.dp2_tp2_to_dp1_tp2"] = resume_case(
        spec_for(dp=2, tp=2), spec_for(tp=2), 4, 2, bitwise=False
    )  # dp shrunk, as a restart refits (on 4 of the 8 ranks, then 2)
    table["resume.dp3_tp2_to_dp2_tp2"] = resume_case(
        dataclasses.replace(spec_for(dp=3, tp=2), batch_size=12),
        dataclasses.replace(spec_for(dp=2, tp=2), batch_size=12), 6, 4, bitwise=False,
    )  # fmt: skip
    table["resume.dp4_hsdp2_to_dp2_fsdp"] = resume_case(
        spec_for(dp=4, shard=2), spec_for(dp=2, shard=2), 4, 2, bitwise=False
    )  # hybrid sharding after a node is lost: one replica of each shard left, sharded as before
    table["corrupt"] = corrupt
    return table
