"""Issue 60's goal, as a benchmark (root: emulated nodes): a `minipar train` on 3 nodes (dp 3 x
tp 2, 6 ranks) with 5 nodes killed over its run and --max-restarts 5 finishes; no step's work is
lost beyond the last checkpoint; its final weights are, bit for bit, those of a run without
faults that makes the same layout changes at the same steps (and within --check's bound of the
dense twin).

    sudo python scripts/restart_goal.py [--steps 30] [--spares 3] [--json out.json]

With 3 spare nodes the first three dead nodes are replaced (the layout kept), the last two are
dropped: dp 3 -> 2 -> 1. Prints the restart log (what died, when, the checkpoint resumed from,
steps and seconds lost) and the comparison.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

from minipar.models import checkpoint_files, checkpoint_loader, training
from minipar.models.config import GPTConfig, RunSpec


def train(folder, ranks, steps, run_args=(), dp=None):
    cmd = [sys.executable, "-m", "minipar", "run", "-n", str(ranks), "--timeout", "900",
           *run_args, "-m", "minipar", "train", "--dp", str(dp or ranks // 2), "--tp", "2",
           "--batch-size", "12", "--steps", str(steps), "--layers", "2",
           "--checkpoint-every", "3", "--checkpoint-dir", folder]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", MINIPAR_TIMEOUT="20")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{(done.stdout + done.stderr)[-4000:]}")
    return done


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--spares", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="minipar-goal-")
    try:
        log = os.path.join(work, "restarts.json")
        kills = [4, 9, 14, 19, 24]
        faults = sum((["--fault", f"kill-node:random@step={s}"] for s in kills), [])
        done = train(os.path.join(work, "run"), 6, args.steps,
                     ["--nodes", "3", "--max-restarts", "5", "--spare-nodes", str(args.spares),
                      "--fault-seed", "60", "--restart-log", log, *faults], dp=3)  # fmt: skip
        print("\n".join(line for line in done.stderr.splitlines() if "restart" in line))
        with open(log) as f:
            account = json.load(f)
        # the same layout changes at the same steps, without a fault: one segment per layout
        attempts, restarts = account["attempts"], account["restarts"]
        ends = [r["resumed_from"] for r in restarts] + [args.steps]
        segments = []
        for attempt, end in zip(attempts, ends):
            if segments and segments[-1][0] == attempt["ranks"]:
                segments[-1] = (attempt["ranks"], end)
            else:
                segments.append((attempt["ranks"], end))
        ref = os.path.join(work, "ref")
        for ranks, end in segments:
            train(ref, ranks, end)
        got, _ = checkpoint_loader.load_dense(
            checkpoint_files.step_dir(os.path.join(work, "run"), args.steps)
        )
        want, _ = checkpoint_loader.load_dense(checkpoint_files.step_dir(ref, args.steps))
        bitwise = all(torch.equal(got[k], want[k]) for k in want)
        _, dense, _ = training.train_dense(RunSpec(steps=args.steps, batch_size=12,
                                                   model=GPTConfig(n_layers=2)))  # fmt: skip
        close = all(torch.allclose(got[k], v, rtol=1e-3, atol=1e-4)
                    for k, v in dense.state_dict().items())  # fmt: skip
        # the newest checkpoint before each failure is the one resumed from (saves every 3)
        lost_beyond = [r for r in restarts if r["resumed_from"] < r["step_reached"] // 3 * 3]
        result = {"segments": segments, "bitwise_vs_same_changes": bitwise,
                  "within_check_bound_of_dense": close, "restarts": restarts,
                  "wall_s": account["wall_s"],
                  "lost_beyond_last_checkpoint": lost_beyond}  # fmt: skip
        print(json.dumps(result, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return 0 if bitwise and close and not lost_beyond else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
