"""The planner's predicted step time for the tiny GPT against what `minipar train` measures.

    python scripts/plan_vs_train.py --layouts 1x1x1 2x1x1 4x1x1 8x1x1 2x2x2 --steps 20
    python scripts/plan_vs_train.py --layouts all8 --steps 8     # every 8-rank layout

First it measures this machine: the matmul rate of one process (planner.measure_flops), the
efficiency and per-op cost of a dense step of the tiny GPT (planner.measure_compute) and, for
each number of ranks the layouts use, the seconds per message-step and per byte of a step with
that many ranks and the share of a core each gets computing the tiny GPT
(minipar.bench.step_latency with gpt_work). Then for each dp x tp x pp layout: `minipar train
--json` (launched on dp*tp*pp ranks), and minipar.planning.planner.evaluate for the same layout
on the "cpu" cluster twice: "old", the matmul rate shared among the ranks (planner.shared_cores),
and "new", calibrated (planner.calibrated_cpu: the measured efficiency, per-op cost and share of a
core per rank, and every message-step on the critical path at the measured cost). Prints a
markdown table (min / median / max of the measured steps, the first step excluded) for docs/.
Run it on a quiet machine; `--json PATH` also keeps every number.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile

from minipar import launcher
from minipar.bench import step_latency
from minipar.planning import planner
from minipar.planning.step_messages import message_steps


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
        help="dp x tp x pp, e.g. 2x2x2 (commas too: 1x1x8,1x8x1)",
    )
    parser.add_argument(
        "--microbatches",
        type=int,
        default=0,
        help="per dp rank (default: 1 without a pipeline, else min(8/dp, 2 pp))",
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", metavar="PATH", help="also write every number here")
    args = parser.parse_args()
    chosen = layouts([t for text in args.layouts for t in text.split(",")])
    model, cores = planner.MODELS["tiny"], launcher.cores()
    rate = planner.measure_flops()
    fit = planner.measure_compute(rate)
    calibrated = dataclasses.replace(
        planner.CLUSTERS["cpu"], efficiency=fit["efficiency"], op_overhead=fit["op_overhead"]
    )
    dense = ", ".join(f"{m} micro-batches {t * 1e3:.0f} ms" for m, t in fit["step_seconds"].items())
    print(
        f"measured matmul rate: {rate / 1e9:.2f} GFLOP/s per core, {cores} cores; a dense step "
        f"of the tiny GPT in CPU time: {dense}: efficiency {fit['efficiency']:.2f}, "
        f"{fit['op_overhead'] * 1e6:.0f} us per op"
    )
    links, shares = {}, {}
    for ranks in sorted({dp * tp * pp for dp, tp, pp in chosen} - {1}):
        links[ranks], measured = step_latency.measure(ranks, gpt=True)
        shares[ranks] = measured["share"]
        mbps = 1 / links[ranks].beta / 1e6 if links[ranks].beta else float("inf")
        print(
            f"{ranks} ranks: {links[ranks].alpha * 1e3:.3f} ms per message-step, "
            f"{mbps:.3g} MB/s within a step, {shares[ranks]:.2f} of a core per rank "
            f"(cores / ranks = {min(1, cores / ranks):.2f})"
        )
    print()
    print(
        "| dp x tp x pp | m | message-steps | predicted: old / new | "
        "measured step (min / median / max) | measured / new |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for dp, tp, pp in chosen:
        ranks = dp * tp * pp
        m = args.microbatches or (min(model.global_batch // dp, 2 * pp) if pp > 1 else 1)
        micro = model.global_batch // dp // m
        old_cpu = planner.shared_cores(planner.CLUSTERS["cpu"], ranks, cores, rate)
        link, share = links.get(ranks, 0.0), shares.get(ranks)
        new_cpu = planner.calibrated_cpu(ranks, cores, link, rate, share, calibrated)
        old = planner.evaluate(model, old_cpu, dp, tp, pp, micro)
        new = planner.evaluate(model, new_cpu, dp, tp, pp, micro)
        steps = sorted(measure(dp, tp, pp, m, args.steps)["step_seconds"][1:])
        median = statistics.median(steps)
        n_steps = sum(message_steps(model, new).values())
        print(
            f"| {dp} x {tp} x {pp} | {m} | {n_steps:.0f} | {old.step_time * 1e3:.0f} / "
            f"{new.step_time * 1e3:.0f} ms | {steps[0] * 1e3:.0f} / {median * 1e3:.0f} / "
            f"{steps[-1] * 1e3:.0f} ms | {median / new.step_time:.2f} |",
            flush=True,
        )
        rows.append({"layout": [dp, tp, pp], "m": m, "message_steps": n_steps,
                     "old": old.time, "new": new.time, "measured": steps})  # fmt: skip
    if args.json:
        found = {"rate": rate, "compute": fit, "cores": cores, "rows": rows}
        found["links"] = {n: vars(link) for n, link in links.items()}
        found["shares"] = shares
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)


if __name__ == "__main__":
    main()
