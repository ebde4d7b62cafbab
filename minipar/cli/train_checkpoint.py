"""`minipar train`'s sharded checkpoints and restarts: the flags, their checks, the resume.

    minipar train --dp 3 --tp 2 --batch-size 12 --steps 40 --checkpoint-every 5 --checkpoint-dir ck
    minipar run --max-restarts 3 -n 6 -m minipar train ... --checkpoint-dir ck   # supervised

With --checkpoint-dir the run resumes from the newest whole checkpoint there (none: from the
start) and trains until --steps steps are done in all; every --checkpoint-every steps, and at
the end, every rank saves its pieces (models/checkpoint_saver.py; a thread writes them, or the
step itself with --checkpoint-blocking). Under `minipar run --max-restarts` (MINIPAR_REFIT set)
a world that lost ranks is refitted: dp shrinks to the ranks left, tp, pp and cp kept (and
hybrid sharding's shard group: its replicas shrink).
MINIPAR_PROGRESS=FILE: rank 0 appends "step time" after every step, each rank writes its pid
to FILE.rankN (the supervisor's view of the run: launcher/supervisor.py).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from minipar.models.config import GPTConfig

REFIT_ENV = "MINIPAR_REFIT"
PROGRESS_ENV = "MINIPAR_PROGRESS"


def add_flags(parser) -> None:
    ck = parser.add_argument_group("sharded checkpoints (docs/checkpoints.md)")
    ck.add_argument("--checkpoint-dir", metavar="DIR",
                    help="save sharded checkpoints here; resume from the newest whole")  # fmt: skip
    ck.add_argument("--checkpoint-every", type=int, default=None, metavar="K",
                    help="save every K steps (and at the end)")  # fmt: skip
    ck.add_argument("--keep", type=int, default=2, metavar="N",
                    help="whole checkpoints kept (default 2)")  # fmt: skip
    ck.add_argument("--checkpoint-blocking", action="store_true",
                    help="write on the step itself, not in a thread (to compare)")  # fmt: skip


def problems(args) -> list[str]:
    """What is wrong with the checkpoint flags, each naming the flag (before any rank starts)."""
    found = []
    every, folder = args.checkpoint_every, args.checkpoint_dir
    if every is not None and (isinstance(every, bool) or every < 1):
        found.append(f"--checkpoint-every must be a positive integer, got {every}")
    if args.keep < 1:
        found.append(f"--keep must be at least 1, got {args.keep}")
    if every is not None and not folder:
        found.append("--checkpoint-every needs --checkpoint-dir DIR")
    if folder and args.resume:
        found.append("give --resume FILE (a dense checkpoint) or --checkpoint-dir, not both")
    if folder and os.path.exists(folder) and not os.path.isdir(folder):
        found.append(f"--checkpoint-dir {folder} is a file, not a folder")
    return found


def refit(args, world: int) -> str | None:
    """Under a supervisor (MINIPAR_REFIT), dp refitted to a world that lost ranks: a line
    saying so, or None when nothing changed. ValueError when no dp fits."""
    rest = args.cp * args.tp * args.pp
    if not os.environ.get(REFIT_ENV) or args.dp * rest == world:
        return None
    if world % rest or world < rest:
        raise ValueError(
            f"cannot refit dp={args.dp} x cp={args.cp} x tp={args.tp} x pp={args.pp} to "
            f"{world} ranks: tp, pp and cp are kept, so the ranks must be a multiple of "
            f"{rest} (dp shrinks first; a layout needing a new tp or pp is refused)"
        )
    old, args.dp = args.dp, world // rest
    if args.dp % args.ep:
        raise ValueError(f"cannot refit to dp={args.dp}: --ep {args.ep} must divide it")
    return f"refitted to {world} ranks: dp {old} -> {args.dp} (tp, pp, cp kept{_rehybrid(args)})"


def _rehybrid(args) -> str:
    """Hybrid sharding refitted with dp: the shard group (a node's ranks) kept, the replicas
    shrunk (a lost node takes whole replicas of every shard); ValueError when --dp-shard no
    longer divides dp. The words added to refit's line."""
    shard = getattr(args, "dp_shard", None)
    if not shard:
        return ""
    if args.dp % shard:
        raise ValueError(
            f"cannot refit hybrid sharding to dp={args.dp}: --dp-shard {shard} must divide it "
            f"(the ranks left hold {args.dp / shard:g} shard groups of {shard})"
        )
    old, args.dp_replicate = args.dp_replicate, args.dp // shard
    return f"; --dp-shard {shard} kept, --dp-replicate {old} -> {args.dp_replicate}"


def resume(args, spec, mesh, comm, log):
    """(spec with the checkpoint's model and the steps left, dense model, start step,
    AdamW state, loss scaler state, the folder) from the newest whole checkpoint; the spec
    as given and Nones when there is none. Collective (every rank)."""
    # here, not at the top of the file: torch loads only when used
    from minipar.models import checkpoint_loader

    folder, manifest = checkpoint_loader.choose(args.checkpoint_dir, comm, log)
    if folder is None:
        return spec, None, 0, None, None, None

    spec = dataclasses.replace(spec, model=GPTConfig(**manifest["config"]))
    model, opt_state, start, extra = checkpoint_loader.load_for_mesh(folder, manifest, spec, mesh)
    if comm.rank == 0:
        log(f"resumed from {folder} (step {start}, saved at layout "
            f"{layout_text(manifest['layout'])}, {manifest['world']} ranks)")  # fmt: skip
    left = max(args.steps - start, 0)
    return dataclasses.replace(spec, steps=max(left, 1)), model, start, opt_state, extra.get(
        "loss_scaler"), folder  # fmt: skip


def dense_start(folder: str):
    """(dense GPT, {"optimizer": AdamW state by name}, loss scaler state) of a sharded
    checkpoint, on one process: --check's dense twin starts there."""
    # here, not at the top of the file: torch loads only when used
    from minipar.models import checkpoint_loader
    from minipar.models.gpt import GPT

    state, opt_state = checkpoint_loader.load_dense(folder)
    _, manifest = checkpoint_loader.files.problem(folder)
    model = GPT(GPTConfig(**manifest["config"]))
    model.load_state_dict(state)
    return model, {"optimizer": opt_state}, manifest["extra"].get("loss_scaler")


def layout_text(layout: dict) -> str:
    """'dp 3 x tp 2'; hybrid sharding: 'dp 4 (hybrid: shard 2 x replicate 2)'."""
    text = " x ".join(f"{k} {layout[k]}" for k in ("dp", "cp", "tp", "pp") if layout[k] > 1)
    shard = layout.get("dp_shard") or layout["dp"]  # older manifests have no dp_shard
    if shard < layout["dp"]:
        text = text.replace(
            f"dp {layout['dp']}",
            f"dp {layout['dp']} (hybrid: shard {shard} x replicate {layout['dp'] // shard})",
        )
    return text or "dp 1"


class Checkpointing:
    """The after_step hook of a run: saves every K steps and at the last, and the progress
    file; `summary` is the line rank 0 prints at the end."""

    def __init__(self, args, spec, mesh, start: int, stats: dict, log):
        from minipar.models.checkpoint_saver import ShardedSaver  # here: torch, when used

        self.every, self.end = args.checkpoint_every, start + spec.steps
        self.spec, self.stats, self.rank = spec, stats, mesh.group.rank
        self.saver = None
        if args.checkpoint_dir:
            self.saver = ShardedSaver(
                args.checkpoint_dir, mesh, spec, args.keep, args.checkpoint_blocking, log
            )
        self.progress = os.environ.get(PROGRESS_ENV)
        if self.progress:
            with open(f"{self.progress}.rank{mesh.group.rank}", "w") as f:
                f.write(str(os.getpid()))

    def __call__(self, step: int, part, opt) -> None:
        done = step + 1
        if self.saver and ((self.every and done % self.every == 0) or done == self.end):
            extra = {
                "loss_scaler": self.stats.get("scaler"),
                "data": {"seed": self.spec.seed, "next_step": done,
                         "batch_size": self.spec.batch_size},
                "lr": {"at_next_step": self.spec.lr_at(done)},
            }  # fmt: skip
            self.saver.save(done, part, opt, extra)
        if self.progress and self.rank == 0:
            with open(self.progress, "a") as f:
                f.write(f"{done} {time.time():.3f}\n")

    def finish(self) -> list[str]:
        if self.saver is None:
            return []
        self.saver.finish()
        return self.saver.errors

    def summary(self, step_times: list[float]) -> str:
        """'N overlapped saves: a saving step X ms over a plain one (median, Y% of a step); the
        copy C ms, the thread's write W ms' (or the blocking save's figures). step_times: every
        step's seconds, from the run's first step."""
        import statistics

        costs = self.saver.costs if self.saver else []
        if not costs or len(step_times) < 3:
            return ""
        first = self.end - len(step_times)
        saving = {c["step"] - 1 - first for c in costs}
        plain = [t for i, t in enumerate(step_times[1:], 1) if i not in saving]
        saved = [t for i, t in enumerate(step_times[1:], 1) if i in saving]
        if not plain or not saved:
            return ""
        step = statistics.median(plain)
        lost = statistics.median(saved) - step
        copy = statistics.median(c["copy_s"] + c["wait_s"] for c in costs)
        write = statistics.median(c.get("write_s", 0.0) for c in costs)
        how = "blocking" if self.saver.blocking else "overlapped"
        return (
            f"{len(costs)} {how} saves: a saving step {lost * 1e3:+.1f} ms over a plain one "
            f"(median; {100 * lost / step:+.1f}% of a {step * 1e3:.1f} ms step); the copy "
            f"{copy * 1e3:.1f} ms, the write {write * 1e3:.1f} ms"
        )

    def costs(self, step_times: list[float]) -> dict:
        """The figures of `summary` as data (for --json)."""
        return {
            "saves": self.saver.costs if self.saver else [],
            "summary": self.summary(step_times),
        }


def log_line(text: str) -> None:
    print(f"minipar train: {text}", file=sys.stderr, flush=True)
