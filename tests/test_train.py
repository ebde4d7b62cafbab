"""`minipar train` end to end: a pipeline run launched on 2 ranks checked against the dense
run, its checkpoint resumed on another layout, wrong layouts refused on every rank; dp=2 x pp=2
with recomputation and a trace."""

import json
import os
import subprocess

import pytest
from conftest import warm_python

from minipar import launcher
from minipar.cli.train import _parser, main, to_argv
from minipar.comm.trace import chrome_trace
from minipar.models import checkpoint
from minipar.models.gpt import GPTConfig
from minipar.models.training import RunSpec, tolerances, train_dense

SMALL = ["--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "32"]


def minipar_cli(*argv, timeout=240):
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run(
        warm_python(["-m", "minipar", *argv]),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.own_job
def test_pipeline_run_matches_dense_and_resumes_on_another_layout(tmp_path):
    """pp=2 (2 ranks, 1F1B over 2 micro-batches) for 3 steps, checked by --check; its checkpoint
    resumed on one process for 2 more: all 5 losses are the uninterrupted dense run's (every
    layout of 8 ranks is in test_gpt_mesh.py; this is the command's path)."""
    ckpt, first, second = (str(tmp_path / name) for name in ("ckpt.pt", "a.json", "b.json"))
    done = minipar_cli(
        "train",
        "--pp",
        "2",
        "--microbatches",
        "2",
        "--steps",
        "3",
        "--check",
        "--save",
        ckpt,
        "--json",
        first,
        *SMALL,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "matches the dense run" in out and "dp=1 x tp=1 x pp=2" in out, out[-3000:]
    resumed = minipar_cli("train", "--resume", ckpt, "--steps", "2", "--json", second)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    losses = [json.load(open(path))["losses"] for path in (first, second)]
    spec = RunSpec(steps=5, model=GPTConfig(seq_len=32, hidden=32, n_layers=2, n_heads=4))
    reference = train_dense(spec)[0]
    assert losses[0] + losses[1] == pytest.approx(reference, rel=1e-4), (losses, reference)


@pytest.mark.own_job
def test_wrong_layout_fails_on_every_rank():
    argv = ["-m", "minipar.cli.train", "--dp", "2", "--tp", "2", "--steps", "1", *SMALL]
    done = launcher.run(2, argv, timeout=120, capture=True)
    assert done.returncode == 2, done.stdout + done.stderr
    for rank in (0, 1):
        assert (
            f"[rank {rank}] minipar train: DeviceMesh: dp=2 x tp=2 x pp=1 = 4 ranks, but the "
            "group has 2" in done.stderr
        ), done.stderr


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"tp": 3}, "n_heads=8 is not divisible by tp=3"),
        ({"pp": 3}, "n_layers=8 is not divisible by pp=3"),
        ({"dp": 2, "microbatches": 3}, "batch_size=8 is not divisible by dp=2 x microbatches=3"),
        ({"schedule": "zigzag"}, "schedule must be one of"),
        ({"steps": 0}, "steps must be a positive integer, got 0"),
        ({"cp": 3}, "seq_len=64 is not divisible by 2cp = 6"),
        ({"cp": 2, "cp_variant": "zigzag"}, "cp_variant must be one of ring, ulysses"),
        ({"cp": 4, "tp": 4, "cp_variant": "ulysses"}, "n_heads/tp = 8/4 = 2 heads over cp=4"),
        ({"cp": 2, "pp": 2, "schedule": "zb-h1"}, "--cp with schedule zb-h1"),
        ({"ep": 2}, "ep=2 must divide dp=1"),
        ({"ep": 2, "dp": 2}, "ep=2 needs a mixture of experts"),
    ],
)
def test_layout_validation(changes, message):
    with pytest.raises(ValueError, match=message):
        RunSpec(model=GPTConfig(), **changes).validate()


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"ep": 3, "dp": 3, "batch_size": 9}, "n_experts=4 is not divisible by ep=3"),
        ({"dp": 2, "fsdp": True}, "--moe with --fsdp"),
        ({"pp": 2, "schedule": "zb-h1"}, "--moe with schedule zb-h1"),
    ],
)
def test_moe_layout_validation(changes, message):
    with pytest.raises(ValueError, match=message):
        RunSpec(model=GPTConfig(n_experts=4), **changes).validate()
    with pytest.raises(ValueError, match="top_k from 1 to n_experts"):
        GPTConfig(n_experts=2, top_k=3)


@pytest.mark.own_job  # `minipar train`
def test_moe_run_matches_dense_and_shows_the_load(tmp_path):
    """`minipar train --moe --experts 4 --ep 2 --check`: 2 ranks (dp = ep = 2), each holding 2
    of block 1's 4 experts; --check compares the first step's gradients, every loss and the
    final weights with the dense GPT (every expert local); the summary shows the load."""
    record = str(tmp_path / "moe.json")
    argv = ["train", "--moe", "--experts", "4", "--ep", "2", "--check", "--steps", "2"]
    done = minipar_cli(*argv, "--json", record, *SMALL)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "matches the dense run" in out and "dp=2 x tp=1 x pp=1, ep=2" in out, out[-3000:]
    assert "MoE load, block 1" in out and "dropped 0 of" in out, out[-3000:]
    imbalance = json.load(open(record))["moe_imbalance"]["block 1"]
    assert 1.0 <= imbalance <= 4.0


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--dp", "6", "--dp-shard", "4"], "--dp 6 is not --dp-shard 4 x --dp-replicate 1"),
        (["--dp-shard", "0"], "--dp-shard must be a positive integer, got 0"),
        (["--dp-shard", "2", "--dp-replicate", "2", "--cp", "2"], "--dp-shard 2 with --cp 2"),
    ],
)
def test_hybrid_sharding_flags_refused_before_any_rank(argv, message, capsys):
    """--dp-shard / --dp-replicate checked in this process by the command's main: status 2
    before any rank is launched."""
    assert main(_parser().parse_args([*argv, "--steps", "1", *SMALL])) == 2
    assert message in capsys.readouterr().err


def test_hybrid_sharding_flags_resolve():
    """Either flag alone, with --dp, gives the other; both set dp and turn FSDP on; checkpoints
    (sharded or dense) go with them."""
    from minipar.cli import train_checks

    for argv, want in (
        (["--dp-shard", "2", "--dp-replicate", "3"], (6, 2, 3)),
        (["--dp", "8", "--dp-shard", "4"], (8, 4, 2)),
        (["--dp", "8", "--dp-replicate", "4"], (8, 2, 4)),
        (["--dp-shard", "2", "--dp-replicate", "2", "--checkpoint-dir", "ck"], (4, 2, 2)),
        (["--dp-shard", "2", "--dp-replicate", "2", "--save", "ck.pt"], (4, 2, 2)),
    ):
        args = _parser().parse_args(argv)
        assert train_checks.hybrid(args) is None
        assert (args.dp, args.dp_shard, args.dp_replicate, args.fsdp) == (*want, True), argv


def test_options_travel_to_the_ranks():
    args = _parser().parse_args(["--dp", "2", "--check", "--plot", "x.png", "--lr", "0.01"])
    again = _parser().parse_args(to_argv(args))
    assert vars(again) == {**vars(args), "timeout": None}


@pytest.mark.own_job  # `minipar train`
def test_recompute_and_trace_through_the_command(tmp_path):
    """dp=2 x pp=2 with full recomputation, checked by --check; --trace writes valid trace-event
    JSON of the 4 ranks and its PNG; the summary's activation table has the three columns."""
    out = tmp_path / "t.json"
    done = minipar_cli(
        "train", "--dp", "2", "--pp", "2", "--microbatches", "2", "--steps", "1",
        "--recompute", "full", "--check", "--trace", str(out), *SMALL,
    )  # fmt: skip
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    assert "matches the dense run" in text and "full recomputation" in text, text[-3000:]
    assert "activations kept for backward (recompute: full)" in text, text[-3000:]
    doc = json.loads(out.read_text())
    assert chrome_trace.validate(doc) == []
    assert {e["pid"] for e in doc["traceEvents"]} == {0, 1, 2, 3}
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gradient_check_sees_a_constant_factor():
    """--check's gradient comparison: the dense model's own gradients pass; scaled by 2 (a loss
    not divided by its micro-batch count) or by 1.001 every tensor is named with its norm ratio;
    a missing parameter is named too."""
    from minipar.models.gpt import build_gpt
    from minipar.models.training import compare_gradients, dense_gradients

    spec = RunSpec(model=GPTConfig(seq_len=8, hidden=16, n_layers=2, n_heads=2))
    ref = dense_gradients(spec)
    assert set(ref) == {n for n, _ in build_gpt(spec.model, spec.seed).named_parameters()}
    assert compare_gradients({k: v.clone() for k, v in ref.items()}, ref) == []
    for factor, shown in ((2.0, "norm 2x"), (1.001, "norm 1.001x")):
        problems = compare_gradients({k: factor * v for k, v in ref.items()}, ref)
        assert len(problems) == len(ref) and all(shown in p for p in problems), problems[:2]
    missing = dict(ref)
    missing.pop("head.proj.weight")
    assert "gradient names differ: ['head.proj.weight']" in compare_gradients(missing, ref)[0]


@pytest.mark.own_job
def test_fp16_clip_and_schedule_resume_where_they_stopped(tmp_path):
    """dp=2 in fp16 with the loss scaler, --clip and a cosine schedule for 3 steps, checked by
    --check (norms each step); resumed on one process for 2 more: the checkpoint carries the
    loss scaler, the schedule goes on from step 3 (--decay-steps 5: where the decay ends), and
    the 5 losses are the uninterrupted dense run's."""
    ckpt, first, second = (str(tmp_path / name) for name in ("ckpt.pt", "a.json", "b.json"))
    policy = ["--dtype", "fp16", "--clip", "0.5", "--warmup", "2", "--lr-schedule", "cosine"]
    policy += ["--min-lr", "1e-4", "--decay-steps", "5", *SMALL]
    done = minipar_cli("train", "--dp", "2", "--steps", "3", "--check", "--save", ckpt,
                       "--json", first, *policy)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "matches the dense run" in out, out[-3000:]
    assert checkpoint.read(ckpt)["extra"]["loss_scaler"] == {"scale": 2.0**16, "good_steps": 3}
    resumed = minipar_cli("train", "--resume", ckpt, "--steps", "2", "--json", second, *policy)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    a, b = (json.load(open(path)) for path in (first, second))
    assert b["loss_scaler"] == {"scale": 2.0**16, "good_steps": 5}
    spec = RunSpec(steps=5, model=GPTConfig(seq_len=32, hidden=32, n_layers=2, n_heads=4),
                   dtype="fp16", clip=0.5, warmup=2, lr_schedule="cosine", min_lr=1e-4)  # fmt: skip
    assert a["lrs"] + b["lrs"] == [spec.lr_at(i) for i in range(5)]
    stats = {}
    reference = train_dense(spec, stats=stats)[0]
    tol = tolerances(spec)
    for got, want in zip(a["losses"] + b["losses"], reference):
        assert abs(got - want) <= tol["loss_atol"] + tol["loss"] * abs(want), (got, want)
    for got, want in zip(a["grad_norms"] + b["grad_norms"], stats["norms"]):
        assert abs(got - want) <= tol["norm"] * want, (got, want)
