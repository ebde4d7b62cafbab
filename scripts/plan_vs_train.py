"""The planner's predicted step time for the tiny GPT against what `minipar train` measures.

    python scripts/plan_vs_train.py --layouts 1x1x1 2x1x1 4x1x1 8x1x1 2x2x2 --steps 20
    python scripts/plan_vs_train.py --layouts all8 --steps 8     # every 8-rank layout

For each dp x tp x pp layout: `minipar train --json` (launched on dp*tp*pp ranks), then
minipar.planner.evaluate for the same layout on the "cpu" cluster, with this CPU's measured
matmul rate shared among the ranks. Prints a markdown table (min / median / max of the measured
steps, the first step excluded) for docs/. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from minipar import launcher, planner


def measure(dp: int, tp: int, pp: int, microbatches: int, steps: int) -> dict:
    out = os.path.join(tempfile.mkdtemp(prefix="plan-vs-train-"), "run.json")
    argv = [
        "--dp",
        str(dp),
        "--tp",
        str(tp),
        "--pp",
        str(pp),
        "--steps",
        str(steps),
        "--microbatches",
        str(microbatches),
        "--json",
        out,
    ]
    done = subprocess.run(
        [sys.executable, "-m", "minipar", "train", *argv], text=True, capture_output=True
    )
    if done.returncode != 0:
        raise SystemExit(f"minipar train {' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


def layouts(texts: list[str]) -> list[tuple[int, int, int]]:
    """(dp, tp, pp) from "DPxTPxPP" texts; "all8": every 8-rank layout with degrees 1, 2, 4, 8."""
    out = []
    for text in texts:
        if text == "all8":
            d = (1, 2, 4, 8)
            out += [(a, b, c) for a in d for b in d for c in d if a * b * c == 8]
        else:
            out.append(tuple(int(x) for x in text.split("x")))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--layouts",
        nargs="+",
        default=["1x1x1", "2x1x1", "4x1x1", "8x1x1"],
        help="dp x tp x pp, e.g. 2x2x2",
    )
    parser.add_argument(
        "--microbatches",
        type=int,
        default=0,
        help="per dp rank (default: 1 without a pipeline, else min(8/dp, 2 pp))",
    )
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    rate = planner.measure_flops()
    model = planner.MODELS["tiny"]
    print(f"measured matmul rate: {rate / 1e9:.2f} GFLOP/s per core, {launcher.cores()} cores\n")
    print("| dp x tp x pp | m | predicted step | measured step (min / median / max) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for dp, tp, pp in layouts(args.layouts):
        ranks = dp * tp * pp
        m = args.microbatches or (min(model.global_batch // dp, 2 * pp) if pp > 1 else 1)
        cpu = planner.shared_cores(planner.CLUSTERS["cpu"], ranks, launcher.cores(), rate)
        micro = model.global_batch // dp // m
        predicted = planner.evaluate(model, cpu, dp, tp, pp, micro).step_time
        steps = sorted(measure(dp, tp, pp, m, args.steps)["step_seconds"][1:])
        median = statistics.median(steps)
        print(
            f"| {dp} x {tp} x {pp} | {m} | {predicted * 1e3:.1f} ms | {steps[0] * 1e3:.1f} / "
            f"{median * 1e3:.1f} / {steps[-1] * 1e3:.1f} ms | {median / predicted:.2f} |"
        )


if __name__ == "__main__":
    main()
