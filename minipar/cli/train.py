"""`minipar train`: the tiny GPT trained on a dp x cp x tp x pp mesh (experts over ep of the dp
ranks), with a progress bar and a summary.

    minipar train --dp 2 --steps 50 --check
    minipar train --cp 2 --cp-variant ulysses --check
    minipar train --moe --experts 4 --ep 2 --check

Run from a shell it launches dp*cp*tp*pp ranks under mpiexec (python -m minipar.cli.train ...); run
inside an existing launch (mpiexec, srun, torchrun) it trains on the ranks it finds. The training
itself is minipar.models.training; this module is the command's face.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import sys
import time

import minipar
from minipar import launcher
from minipar.cli import train_checkpoint, train_checks, train_stop, train_view
from minipar.models.config import GPTConfig, RunSpec

EXAMPLES = """\
examples:
  minipar train                               dense, one process, 50 steps of the tiny GPT
  minipar train --dp 4 --steps 20 --check     4 data-parallel ranks, checked against dense
  minipar train --dp 2 --microbatches 2       gradient accumulation over 2 micro-batches
  minipar train --dp 2 --tp 2 --pp 2 --microbatches 4 --schedule 1f1b
  minipar train --dp 4 --tp 2 --fsdp --check  FSDP as the data-parallel part
  minipar train --dp-shard 2 --dp-replicate 2 --check   hybrid sharding: FSDP inside pairs
                                              of dp ranks, the gradient blocks all-reduced across
  minipar train --pp 2 --microbatches 4 --recompute selective --check   recomputation
  minipar train --dp 2 --pp 2 --microbatches 4 --steps 2 --trace out.json   a timeline
  minipar train --cp 2 --check                the sequence over 2 ranks: ring attention
  minipar train --cp 2 --cp-variant ulysses   ... or Ulysses' all-to-alls
  minipar train --moe --experts 4 --ep 2 --check   every other block a mixture of 4 experts,
                                              2 on each of the 2 (dp) ranks
  minipar train --steps 100 --plot loss.png   the loss curve (needs the plot extra)
  minipar train --dp 2 --tp 2 --pp 2 --dtype bf16 --clip 1.0 --warmup 5 --lr-schedule cosine --check
                                              bf16 compute, fp32 master weights, the mesh's
                                              gradient norm clipped, warm-up then cosine
  minipar train --dp 2 --dtype fp16 --reduce-dtype bf16 --clip 1.0   loss scaling; DDP's
                                              all-reduce in bf16 (half the bytes)
  minipar train --save ckpt.pt; minipar train --resume ckpt.pt --dp 2
  mpiexec -n 4 python -m minipar train --dp 4   inside an existing launch

--check trains the dense model on one process from the same weights and batches and compares
the first step's gradients (every parameter gathered back to the dense layout, within 1e-4 of
each tensor's largest element: AdamW would hide a gradient off by a constant factor), the loss at
every step (|a - b| <= 1e-5 + 1e-4 |b|, float32) and the final parameters (<= 1e-4 + 1e-3 |b|);
the exit status is 1 on a mismatch. With --moe the dense model is the same GPT with every expert
local (same routing, dropless); the auxiliary load-balancing loss is not trained, the load is
shown. Refused, with the reason: --moe with --fsdp, and zb-h1 with --cp or --moe. The summary
ends with the bytes autograd kept for backward (measured, minipar's formula, the planner's);
--dtype bf16|fp16 computes under torch.autocast with the weights, gradients and AdamW in fp32
(fp16 adds dynamic loss scaling: a step with an inf or NaN anywhere is skipped on every rank);
--clip MAX clips the whole model's gradient norm (minipar.parallel.clip_grad_norm_) and shows it
each step; --warmup / --lr-schedule / --min-lr / --decay-steps set the learning rate per step.
With them --check also compares every step's norm (fp32: 1e-5 relative; bf16 and fp16: the
bound training.tolerances derives) and uses looser loss and weight bounds in 16-bit compute.
--save stores the loss scaler; --resume continues the schedule from the checkpoint's step.
--trace writes every rank's timeline as Chrome trace-event JSON (Perfetto) and draws it beside
it as a PNG. Ctrl-C stops every rank after the same step (exit 130) and says the steps done,
the newest whole checkpoint and the command that resumes.
"""

_LAUNCHED = "MINIPAR_TRAIN_RANK"  # set for the ranks a `minipar train` launched


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    lay = parser.add_argument_group("layout")
    lay.add_argument("--dp", type=int, default=None, help="dp degree (default 1, or --ep's)")
    for name in ("tp", "pp"):
        lay.add_argument(f"--{name}", type=int, default=1, help=f"{name} degree (default 1)")
    lay.add_argument("--cp", type=int, default=1, help="context-parallel degree (default 1)")
    lay.add_argument("--cp-variant", default="ring", choices=["ring", "ulysses"])
    lay.add_argument("--ep", type=int, default=1, help="expert-parallel degree, divides --dp")
    lay.add_argument("--microbatches", type=int, default=1, help="per dp rank per step")
    lay.add_argument(
        "--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved", "zb-h1"]
    )
    lay.add_argument("--fsdp", action="store_true", help="FSDP as the data-parallel part")
    shard_help = "hybrid sharding: FSDP inside groups of this many dp ranks (a node's)"
    lay.add_argument("--dp-shard", type=int, default=None, help=shard_help)
    copies_help = "hybrid sharding: the copies of each shard (dp = shard x replicate)"
    lay.add_argument("--dp-replicate", type=int, default=None, help=copies_help)
    lay.add_argument("--recompute", default="none", choices=["none", "selective", "full"],
                     help="activation recomputation (default none)")  # fmt: skip
    run = parser.add_argument_group("run")
    run.add_argument("--steps", type=int, default=50)
    run.add_argument("--batch-size", type=int, default=8, help="sequences per step (default 8)")
    run.add_argument("--lr", type=float, default=1e-3)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--layers", type=int, default=8)
    run.add_argument("--hidden", type=int, default=64)
    run.add_argument("--heads", type=int, default=8)
    run.add_argument("--seq", type=int, default=64)
    run.add_argument("--tied", action="store_true", help="tie the head to the embedding")
    run.add_argument("--moe", action="store_true", help="every other block a mixture of experts")
    run.add_argument("--experts", type=int, default=4, help="experts per MoE block (default 4)")
    run.add_argument("--top-k", type=int, default=2, help="experts per token (default 2)")
    run.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    prec = parser.add_argument_group("precision, clip and learning-rate schedule")
    prec.add_argument(
        "--dtype",
        default="fp32",
        choices=["fp32", "bf16", "fp16"],
        help="compute dtype; weights, gradients, AdamW stay fp32 (default fp32)",
    )
    prec.add_argument(
        "--reduce-dtype",
        default="fp32",
        choices=["fp32", "bf16"],
        help="the data-parallel gradient all-reduce's dtype (default fp32)",
    )
    prec.add_argument(
        "--clip",
        type=float,
        default=None,
        metavar="MAX",
        help="clip the whole model's gradient norm to MAX; reports it each step",
    )
    prec.add_argument(
        "--warmup",
        type=int,
        default=0,
        metavar="STEPS",
        help="linear learning-rate warm-up (default 0)",
    )
    prec.add_argument(
        "--lr-schedule",
        default="constant",
        choices=["cosine", "linear", "constant"],
        help="after the warm-up",
    )
    prec.add_argument("--min-lr", type=float, default=0.0, help="the decay's floor (default 0)")
    prec.add_argument(
        "--decay-steps",
        type=int,
        default=None,
        metavar="STEP",
        help="the step the decay reaches --min-lr (default: the run's end)",
    )
    out = parser.add_argument_group("checks and output")
    out.add_argument("--check", action="store_true", help="compare with the dense run")
    out.add_argument("--plot", metavar="PNG", help="write the loss curve")
    out.add_argument("--json", metavar="PATH", help="write losses, step times and memory as JSON")
    out.add_argument("--trace", metavar="JSON", help="write every rank's timeline (and a PNG)")
    out.add_argument("--save", metavar="PATH", help="save the dense checkpoint at the end")
    out.add_argument("--resume", metavar="PATH", help="start from a dense checkpoint")
    out.add_argument("--timeout", type=float, default=None, help="seconds the launch may take")
    train_checkpoint.add_flags(parser)


def to_argv(args) -> list[str]:
    """The options again, for the ranks' own command line."""
    argv = []
    for action in _parser()._actions:
        if not action.option_strings or action.dest in ("help", "timeout"):
            continue
        value, flag = getattr(args, action.dest), action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            argv += [flag] if value else []
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minipar train",
        description="train the tiny GPT",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(parser)
    return parser


def spec_from_args(args):
    model = GPTConfig(
        seq_len=args.seq,
        hidden=args.hidden,
        n_layers=args.layers,
        n_heads=args.heads,
        tied_head=args.tied,
        n_experts=args.experts if args.moe else 0,
        top_k=args.top_k,
    )
    return RunSpec(
        args.dp,
        args.tp,
        args.pp,
        args.microbatches,
        args.schedule,
        args.fsdp,
        args.steps,
        args.batch_size,
        args.lr,
        args.seed,
        model,
        args.recompute,
        args.cp,
        args.cp_variant,
        args.ep,
        dtype=args.dtype,
        reduce_dtype=args.reduce_dtype,
        clip=args.clip,
        warmup=args.warmup,
        lr_schedule=args.lr_schedule,
        min_lr=args.min_lr,
        decay_steps=args.decay_steps,
        dp_shard=getattr(args, "dp_shard", None) or 0,
    )


def inside_launch() -> bool:
    # here, not at the top of the file: numpy loads only when used
    from minipar.runtime.world import MPI_ENV, TORCHRUN_ENV

    return any(v in os.environ for v in MPI_ENV) or all(v in os.environ for v in TORCHRUN_ENV)


def main(args) -> int:
    said = train_checks.hybrid(args)  # --dp-shard / --dp-replicate -> --dp and --fsdp
    if said:
        print(f"minipar train: {said}", file=sys.stderr)
        return 2
    if args.dp is None:  # the experts shard over the dp ranks: --ep 2 alone means dp = 2
        args.dp = args.ep
    for problem in train_checkpoint.problems(args):  # the checkpoint flags, before any rank
        print(f"minipar train: {problem}", file=sys.stderr)
        return 2
    n = args.dp * args.cp * args.tp * args.pp
    said = None if os.environ.get(_LAUNCHED) else train_checks.problem(args, spec_from_args)
    if said:  # before any rank starts, torch not loaded (a checkpoint's model: on the ranks)
        print(f"minipar train: {said}", file=sys.stderr)
        return 2
    if inside_launch() or os.environ.get(_LAUNCHED) or n == 1:
        return run_here(args)

    cmd, env = launcher.command(n, ["-m", "minipar.cli.train", *to_argv(args)])
    env[_LAUNCHED] = "1"
    if sys.stdout.isatty():
        env.setdefault("FORCE_COLOR", "1")
    return train_stop.launch(cmd, env, args.timeout, args.checkpoint_dir, args.steps)


def memory_bytes(device) -> int:
    """This rank's peak memory: CUDA allocations on a GPU, else the process's peak RSS."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def pick_device(choice: str, rank: int):
    import torch

    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def run_here(args) -> int:
    """Train on the ranks of this launch (or this one process) and report on rank 0."""
    # here, not at the top of the file: torch and numpy load only when used
    from minipar.parallel import DeviceMesh

    comm = minipar.init()
    try:
        refitted = train_checkpoint.refit(args, comm.size)  # under a supervisor: dp shrinks
        if refitted and comm.rank == 0:
            train_checkpoint.log_line(refitted)
        # before torch loads: a wrong size fails fast
        mesh = DeviceMesh(args.dp, args.tp, args.pp, cp=args.cp, ep=args.ep)
        spec = spec_from_args(args)
        if not args.resume:  # a checkpoint's model is validated once it is read
            spec.validate()
        # here, not at the top of the file: torch and numpy load only when used
        from minipar.models import checkpoint, training

        device = pick_device(args.device, comm.rank)
        start_model, start, opt_state, scaler_state = None, 0, None, None
        if args.resume:  # the checkpoint's model, whatever the size options say
            record = checkpoint.read(args.resume)
            start_model, start = checkpoint.load(args.resume)  # the schedule's step too
            opt_state = record.get("optimizer")
            scaler_state = record["extra"].get("loss_scaler")
            spec = dataclasses.replace(spec, model=start_model.config)
            spec.validate()
        if args.checkpoint_dir:  # the newest whole checkpoint there, read for this layout
            spec, start_model, start, opt_state, scaler_state, folder = train_checkpoint.resume(
                args, spec, mesh, comm, train_checkpoint.log_line
            )
            if folder and args.check and comm.rank == 0:  # before pruning can remove it
                args.dense_start = train_checkpoint.dense_start(folder)
            if start >= args.steps:
                if comm.rank == 0:
                    train_checkpoint.log_line(f"all {args.steps} steps were done already")
                minipar.finalize()
                return 0
        training.check_supported(spec, mesh)  # before the progress bar appears
        report = Reporter(spec, comm, active=comm.rank == 0)
        report.placement = mesh.where()  # which axes stay inside a node (the node map)
        if 0 < spec.dp_shard < spec.dp:  # hybrid sharding: where its two groups run
            report.placement += ", " + mesh.hybrid_where(spec.dp_shard)
        grads, stats = {}, {}  # --check: the first step's gradients, gathered dense
        saving = train_checkpoint.Checkpointing(
            args, spec, mesh, start, stats, train_checkpoint.log_line
        )

        def keep_grads(step, part):
            if args.check and step == start:
                grads.update(part.dense_grads())

        with train_view.traced(args.trace, comm), report, train_stop.StopFlag() as report.stop:
            losses, model, opt = training.train_on_mesh(
                spec,
                mesh,
                lambda s, loss, t: report.step(s, loss, t, memory_bytes(device), stats),
                start_model,
                start,
                device,
                opt_state,
                keep_grads,
                stats,
                scaler_state,
                after_step=saving,
            )
        failed_saves = saving.finish()
        report.activations = train_view.activation_report(spec, mesh, model, comm)  # collective
        report.gather_state(model, opt, spec)  # collective: every rank's bytes per parameter
        state = training.dense_state(model, mesh)  # collective: every rank gathers
        report.gather_moe(model.moe_stats())
        optimizer = training.mesh_optimizer_state(model, opt) if args.save else None
    except ValueError as error:  # the same words on every rank, then a clean exit
        print(f"[rank {comm.rank}] minipar train: {error}", file=sys.stderr)
        minipar.finalize()
        return 2
    except train_stop.Stopped as stopped:  # Ctrl-C: every rank after the same step
        saving.finish()  # the save in flight made whole before the line names the newest
        if comm.rank == 0:
            train_stop.say(args.checkpoint_dir, stopped.done, args.steps)
        minipar.finalize()
        return 0 if os.environ.get(_LAUNCHED) else 130  # launched: the launcher says 130
    problems = (
        check(spec, args, losses, state, grads, start, stats)
        if args.check and comm.rank == 0
        else []
    )
    status = max(comm.allgather_object(1 if problems or failed_saves else 0))
    if comm.rank == 0:
        report.summary(losses, problems if args.check else None, stats)
        report.checkpoints = saving.costs(report.times)
        if saving.summary(report.times):
            print(f"checkpoints: {saving.summary(report.times)}")
        if args.save:
            checkpoint.save(
                args.save, state, spec.model, start + spec.steps, optimizer,
                loss_scaler=stats.get("scaler"),
            )  # fmt: skip
        if args.plot:
            report.plot(args.plot, losses, start)
        if args.json:
            report.write_json(args.json, losses, problems if args.check else None, stats)
    minipar.finalize()
    return status


def check(spec, args, losses, state, grads, start, stats) -> list[str]:
    """The dense run on this process from the same start, with the same precision policy,
    clip and schedule; the problems found (none: agreed): the first step's gradients, the
    gradient norm of every step, every loss and the final weights, within the precision's
    bounds (training.tolerances)."""
    # here, not at the top of the file: torch and numpy load only when used
    from minipar.models import checkpoint, training

    record = checkpoint.read(args.resume) if args.resume else {}
    model = checkpoint.load(args.resume)[0] if args.resume else None
    scaler_state = record.get("extra", {}).get("loss_scaler")
    if getattr(args, "dense_start", None):  # a sharded checkpoint: its dense state
        model, record, scaler_state = args.dense_start
    tol = training.tolerances(spec)
    t0 = time.perf_counter()
    dense_grads = training.dense_gradients(spec, model, start)
    found = training.compare_gradients(grads, dense_grads, tol["grad"])
    problems = [f"step {start}: {p}" for p in found]
    ref_stats = {}
    reference, dense, _ = training.train_dense(
        spec, None, model, start, record.get("optimizer"), ref_stats, scaler_state
    )
    print(f"dense reference: {len(reference)} steps in {time.perf_counter() - t0:.1f} s")
    seen = training.gaps(grads, dense_grads, stats, ref_stats, losses, reference)
    print(
        "largest differences (bound): "
        + ", ".join(f"{k} {v:.2g} ({tol[k]:.2g})" for k, v in seen.items())
    )
    problems += training.compare_norms(stats, ref_stats, tol["norm"], start)
    return problems + training.compare(
        losses, reference, state, dense.state_dict(), tol["loss"], tol["loss_atol"],
        tol["params"],
    )  # fmt: skip


def step_extras(stats) -> str:
    """'  norm 1.234  lr 2.0e-04' (and 'skipped' for an fp16 overflow) of the last step."""
    if not stats or not stats.get("lrs"):
        return ""
    norm = stats["norms"][-1]
    text = f"  norm {norm:.4g}" if norm is not None else ""
    text += f"  lr {stats['lrs'][-1]:.2e}"
    return text + ("  skipped (fp16 overflow)" if stats["skipped"][-1] else "")


def training_rows(spec, stats: dict) -> list[tuple[str, str]]:
    """The summary's rows for the precision, the gradient norm and the schedule."""
    rows = [("precision", f"{spec.dtype} compute, fp32 weights, gradients and AdamW; "
                          f"gradients reduced in {spec.reduce_dtype}")]  # fmt: skip
    norms = [n for n in stats.get("norms") or [] if n is not None]
    if norms:
        rows.append(("grad norm", f"{norms[0]:.4g} -> {norms[-1]:.4g} (clip {spec.clip})"))
    if stats.get("lrs"):
        lrs = stats["lrs"]
        rows.append(("lr", f"{lrs[0]:.2e} -> {lrs[-1]:.2e} ({spec.warmup} warm-up steps, "
                           f"then {spec.lr_schedule})"))  # fmt: skip
    if stats.get("scaler"):
        skipped = sum(stats.get("skipped") or [])
        rows.append(("loss scale", f"{stats['scaler']['scale']:g}, {skipped} step(s) skipped"))
    return rows


def state_rows(state: list, n_params: int) -> list[tuple[str, str]]:
    """The summary's row for the training state per parameter (rank 0's split, every rank's
    share of the model)."""
    if not state:
        return []
    r = state[0]
    split = ", ".join(f"{k} {r[k]:.2f}" for k in ("weights", "grads", "master", "m", "v"))
    copies = f" + {r['compute_copies']:.2f} low-precision copies in a step" * bool(
        r["compute_copies"]
    )
    held = sorted({round(100 * x["held"] / n_params, 1) for x in state})
    share = f"{held[0]}-{held[-1]}" if len(held) > 1 else f"{held[0]}"
    text = f"{r['total']:.2f} B per held parameter ({split}){copies}; a rank holds {share}%"
    return [("model state", text)]


def describe(spec) -> str:
    """What runs on each axis of the mesh, in words, for the summary."""
    parts = []
    if spec.dp * spec.cp > 1:
        parts.append("FSDP" if spec.fsdp else "DDP")
        if spec.fsdp and 0 < spec.dp_shard < spec.dp:
            parts[-1] = f"hybrid FSDP (sharded over {spec.dp_shard}, x{spec.dp // spec.dp_shard})"
    if spec.cp > 1:
        parts.append(f"{spec.cp_variant} attention over cp={spec.cp}, load-balanced")
    if spec.tp > 1:
        parts.append("Megatron TP, vocabulary-parallel loss" + vocab_padding(spec))
    if spec.pp > 1:
        parts.append(f"{spec.schedule} pipeline")
    if spec.recompute != "none":
        parts.append(f"{spec.recompute} recomputation")
    if spec.model.n_experts:
        m = spec.model
        parts.append(f"MoE every other block: top-{m.top_k} of {m.n_experts}, ep={spec.ep}")
    return ", ".join(parts) or "dense (one process)"


def vocab_padding(spec) -> str:
    """' (vocabulary 256 padded to 258)' when tp does not divide it, else ''."""
    # here, not at the top of the file: the sharding table loads torch
    from minipar.models import sharding
    from minipar.parallel.tensor import plan

    v = spec.model.vocab_size
    padded = plan.padded_vocab(v, spec.tp, sharding.VOCAB_MULTIPLE)
    return f" (vocabulary {v} padded to {padded})" if padded != v else ""


def progress_bar(console=None):
    """train's bar: the label, the bar and "60/400" never cut (a table that is too wide for
    the terminal shrinks every column that may wrap: only the step's info wraps)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Column

    return Progress(
        TextColumn("[bold]train[/]", table_column=Column(no_wrap=True)),
        BarColumn(bar_width=20, table_column=Column(no_wrap=True)),
        MofNCompleteColumn(table_column=Column(no_wrap=True)),
        TextColumn("{task.fields[info]}", table_column=Column(overflow="fold")),
        console=console,
    )


class Reporter:
    """Rank 0's face of the run: a rich progress bar (loss, tokens/s, memory of every rank) and
    the summary table; on other ranks it only takes part in gathering the memory figures."""

    def __init__(self, spec, comm, active: bool):
        self.spec, self.comm, self.active = spec, comm, active
        self.times, self.memory = [], []
        self.activations = None  # train_view.activation_report's, after the run
        self.times, self.memory, self.moe = [], [], {}
        self.state = []  # gather_state's: every rank's bytes per parameter
        self.placement = ""  # where each axis runs (DeviceMesh.where), set once the mesh is
        self.stop = None  # train_stop.StopFlag while the steps run: read at every step

    def gather_state(self, model, opt, spec) -> None:
        """Every rank's training state in bytes per held parameter (models/state_bytes.py)."""
        # here, not at the top of the file: torch loads only when used
        from minipar.models import precision, state_bytes

        dtype = precision.dtype_of(spec.dtype)
        mine = state_bytes.state_bytes(list(model.parameters()), opt, dtype)
        self.state = self.comm.allgather_object(mine)

    def gather_moe(self, stats: dict) -> None:
        """Every rank's MoE blocks' load at the last step, by block (collective: every rank)."""
        # a small control-plane message: rank 0 sees the blocks of every pipeline stage
        for seen in self.comm.allgather_object(stats):
            self.moe.update(seen)

    def __enter__(self):
        if self.active:
            self.progress = progress_bar()
            self.progress.start()
            self.task = self.progress.add_task("train", total=self.spec.steps, info="")
        return self

    def __exit__(self, *exc):
        if self.active:
            self.progress.stop()

    def step(self, step: int, loss: float, seconds: float, memory: int, stats=None) -> None:
        # a small control-plane message (not a minipar collective): every rank's memory, and
        # whether it was asked to stop (Ctrl-C): then every rank stops after this step
        asked = bool(self.stop and self.stop.up())
        seen = self.comm.allgather_object((memory, asked))
        self.memory = [m for m, _ in seen]
        self.times.append(seconds)
        if self.active:
            tokens = self.spec.tokens_per_step / seconds
            mem = f"{min(self.memory) / 2**20:.0f}-{max(self.memory) / 2**20:.0f} MiB/rank"
            info = f"step {step}  loss {loss:.4f}{step_extras(stats)}  {tokens:,.0f} tok/s  {mem}"
            self.progress.update(self.task, advance=1, info=info)
        if any(stop for _, stop in seen):
            raise train_stop.Stopped(step + 1)

    def summary(self, losses, problems, stats=None) -> None:
        import statistics

        from rich.table import Table

        # here, not at the top of the file: rich loads only when used
        from minipar.term import Console

        s, times = self.spec, sorted(self.times[1:] or self.times)  # the first step warms up
        t = Table(title="minipar train", show_header=False, title_justify="left")
        rows = [
            ("layout", f"{s.layout}, {s.microbatches} micro-batch(es)"),
            ("parallelism", describe(s)),
            ("placement", f"{self.placement} ({minipar.num_nodes()} node(s))"),
            ("model", f"{s.model.n_params():,} parameters, {s.model.n_layers} layers"),
            ("loss", f"{losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps"),
            (
                "step time",
                f"{times[0] * 1e3:.1f} / {statistics.median(times) * 1e3:.1f} / "
                f"{times[-1] * 1e3:.1f} ms (min / median / max)",
            ),
            ("tokens/s", f"{s.tokens_per_step / statistics.median(times):,.0f} (median step)"),
            (
                "peak memory",
                f"{min(self.memory) / 2**20:.0f} - {max(self.memory) / 2**20:.0f} MiB per rank",
            ),
        ]
        rows += training_rows(s, stats or {}) + state_rows(self.state, s.model.n_params())
        for block, load in sorted(self.moe.items(), key=lambda kv: int(kv[0].split()[1])):
            rows.append((f"MoE load, {block}", f"{load.summary(s.ep)} (last step)"))
        if problems is not None:
            verdict = (
                "[green]matches the dense run[/]"
                if not problems
                else (f"[bold red]{len(problems)} mismatch(es)[/]: " + "; ".join(problems[:3]))
            )
            rows.append(("check", verdict))
        for row in rows:
            t.add_row(*row)
        Console(highlight=False).print(t)
        if self.activations is not None:
            Console(highlight=False).print(train_view.activation_table(self.activations))

    def write_json(self, path: str, losses, problems, stats=None) -> None:
        import json

        s = self.spec
        record = {
            "layout": {
                "dp": s.dp,
                "tp": s.tp,
                "pp": s.pp,
                "cp": s.cp,
                "ep": s.ep,
                "microbatches": s.microbatches,
            },
            "moe_imbalance": {block: st.imbalance for block, st in self.moe.items()},
            "tokens_per_step": s.tokens_per_step,
            "losses": losses,
            "step_seconds": self.times,
            "peak_memory_bytes": self.memory,
            "activations": self.activations,
            "check": problems,
            "dtype": s.dtype,
            "grad_norms": (stats or {}).get("norms"),
            "lrs": (stats or {}).get("lrs"),
            "skipped": (stats or {}).get("skipped"),
            "loss_scaler": (stats or {}).get("scaler"),
            "checkpoints": getattr(self, "checkpoints", None),  # train_checkpoint's costs
        }
        with open(path, "w") as f:
            json.dump(record, f, indent=1)

    def plot(self, path: str, losses, start: int) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            from matplotlib import pyplot as plt
        except ImportError:
            print("minipar train: --plot needs matplotlib (pip install minipar[plot])")
            return
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(range(start, start + len(losses)), losses)
        ax.set(
            xlabel="step",
            ylabel="loss",
            title=f"tiny GPT, {self.spec.layout}",
        )
        fig.savefig(path, dpi=120, bbox_inches="tight")
        print(f"loss curve written to {path}")


if __name__ == "__main__":
    sys.exit(main(_parser().parse_args()))
