"""The node-aware planner against `minipar train` on 2 emulated nodes (issue 58's goal: every
layout within 25% of the measured step, with --fill block and --fill cyclic).

    python scripts/plan_against_runs.py --record tests/data/plan_runs_two_nodes.json   # measure
    python scripts/plan_against_runs.py --table tests/data/plan_runs_two_nodes.json    # compare

--record (as root: namespaces and tc) runs, for every link rate, fill and layout of 4 ranks,

    python -m minipar run --nodes 2 -n 4 --link RATE --fill FILL \\
        -m minipar train LAYOUT --layers 2 --hidden 256 --heads 4 --seq 64 --batch-size 8 \\
        --steps N --json F

and stores each run's measured step (median, min, max of the steps after the first), the load
average before it and near its end, and how much of the machine other jobs used meanwhile
(busy cores from /proc/stat less this job's own CPU seconds): the runs, not the planner's
predictions. The load average counts this job's own 4 ranks (about 4 of it while they run, and
what is left of the previous run's before), so the retry rule reads what other jobs did: a run
during which they kept more than --max-others cores busy is taken again after a pause, up to
--tries times, and the quietest try is kept; each record says how many tries it took. --table
prices every record with the planner (the same arithmetic the test in tests/test_plan_nodes.py
asserts) and prints predicted against measured, the ratio, and its min / median / max over the
table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# the tiny GPT of tests/test_plan_nodes.py's TINY: 2 layers, hidden 256, 4 heads, 8 x 64 tokens
MODEL = ["--layers", "2", "--hidden", "256", "--heads", "4", "--seq", "64", "--batch-size", "8"]

# name -> minipar train's layout flags (4 ranks each)
LAYOUTS = {
    "dp4": ["--dp", "4"],
    "tp2xdp2": ["--dp", "2", "--tp", "2"],
    "tp4": ["--tp", "4"],
    "pp2xdp2": ["--dp", "2", "--pp", "2", "--microbatches", "2"],
    "pp2xtp2": ["--tp", "2", "--pp", "2", "--microbatches", "4"],
    "cp2xdp2": ["--dp", "2", "--cp", "2"],
    "fsdp-dp4": ["--dp", "4", "--fsdp"],
    "hybrid-2x2": ["--dp-shard", "2", "--dp-replicate", "2"],
    "ep2xdp4": ["--dp", "4", "--moe", "--experts", "4", "--ep", "2"],
}
LINKS = {"200mbit": 200e6, "2gbit": 2e9}  # minipar run --link spellings, bits per second
FILLS = ("block", "cyclic")


def busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def load1() -> float:
    return os.getloadavg()[0]


def run_once(link: str, fill: str, layout: str, steps: int, timeout: float) -> dict:
    """One `minipar train` on 2 emulated nodes: its steps and the machine's load around it."""
    out = os.path.join(tempfile.mkdtemp(prefix="plan-runs-"), "run.json")
    cmd = [sys.executable, "-m", "minipar", "run", "--nodes", "2", "-n", "4", "--link", link,
           "--fill", fill, "--timeout", str(timeout), "-m", "minipar", "train",
           *LAYOUTS[layout], *MODEL, "--steps", str(steps), "--json", out]  # fmt: skip
    before, (busy0, total0) = load1(), busy_jiffies()
    ours0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    during = []
    stop = threading.Event()

    def sample():  # the 1-minute load every 2 s while the job runs
        while not stop.wait(2.0):
            during.append(load1())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    done = subprocess.run(cmd, text=True, capture_output=True)
    stop.set()
    sampler.join()
    wall = time.monotonic() - start
    ours1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy1, total1 = busy_jiffies()
    if done.returncode != 0:
        print(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}", flush=True)
        return {}
    with open(out) as f:
        record = json.load(f)
    os.remove(out)
    os.rmdir(os.path.dirname(out))
    cores = os.cpu_count() or 1
    busy_cores = (busy1 - busy0) / max(1, total1 - total0) * cores
    ours = (ours1.ru_utime - ours0.ru_utime + ours1.ru_stime - ours0.ru_stime) / wall
    times = sorted(record["step_seconds"][1:])  # the first step warms up
    return {
        "link": link,
        "link_bits_per_s": LINKS[link],
        "fill": fill,
        "layout": layout,
        "train_args": LAYOUTS[layout] + MODEL,
        "mesh": record["layout"],
        "steps": steps,
        "step_seconds": record["step_seconds"],
        "median": statistics.median(times),
        "min": times[0],
        "max": times[-1],
        "load_before": round(before, 2),
        "load_during": round(max(during, default=load1()), 2),
        "others_cores": round(max(0.0, busy_cores - ours), 2),
        "wall_s": round(wall, 1),
    }


def dense_step(steps: int = 5) -> dict:
    """CPU seconds of one dense training step of the tiny GPT above on this one process (the
    fastest of `steps` after a warm-up; time.process_time, so other jobs' load does not count),
    with 1 and with 4 micro-batches: the compute the planner's rate is calibrated to."""
    from minipar.models import training
    from minipar.models.config import GPTConfig
    from minipar.models.data import Batches, load_tokens
    from minipar.models.gpt import build_gpt

    config = GPTConfig(seq_len=64, hidden=256, n_layers=2, n_heads=4)
    model = build_gpt(config, 0)
    opt = training.make_optimizer(model, 1e-3)
    inputs, targets = Batches(load_tokens(), 8, 64, 0).get(0)
    seconds = {}
    for m in (1, 4):
        times = []
        for _ in range(steps + 1):
            start = time.process_time()
            training.accumulate(model, inputs, targets, m, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.process_time() - start)
        seconds[str(m)] = min(times[1:])
    return seconds


def step_waits(ranks: int = 4) -> dict:
    """Seconds per message-step of 4 ranks on this machine's cores, measured busy (between the
    tiny GPT's passes: minipar.bench.step_latency with gpt_work), its seconds per byte within a
    step, and the share of a core each rank computed with: what the planner's calibrated_cpu
    takes when ranks outnumber cores. One rank a core here needs none."""
    from minipar.bench import step_latency

    link, measured = step_latency.measure(ranks, gpt=True)
    return {"alpha": link.alpha, "beta": link.beta, "share": measured["share"],
            "load": round(load1(), 2)}  # fmt: skip


def calibrate() -> dict:
    """This machine's compute and message-step costs, as the test prices the runs with them."""
    return {"dense_step_cpu_s": dense_step(), "step_latency_4": step_waits(4)}


def record(args) -> None:
    calibration = {"before": calibrate()}
    runs = []
    chosen = [tuple(t.split(":")) for t in args.only] or [
        (link, fill, layout) for link in args.links for fill in FILLS for layout in args.layouts
    ]
    for link, fill, layout in chosen:
        tries = []
        for _ in range(args.tries):
            run = run_once(link, fill, layout, args.steps, args.timeout)
            if not run:
                break
            tries.append(run)
            if run["others_cores"] <= args.max_others:
                break
            print(f"  others used {run['others_cores']} cores: again", flush=True)
            time.sleep(args.pause)
        if not tries:
            continue
        run = min(tries, key=lambda r: r["others_cores"])  # the quietest try
        run["tries"] = len(tries)
        runs.append(run)
        print(
            f"{link:8} {fill:6} {layout:11} median {run['median'] * 1e3:6.0f} ms "
            f"({run['min'] * 1e3:.0f}-{run['max'] * 1e3:.0f}) load {run['load_before']}"
            f" / {run['load_during']}, others {run['others_cores']} cores",
            flush=True,
        )
    calibration["after"] = calibrate()
    found = {
        "what": "minipar train on 2 emulated nodes x 2 ranks (scripts/plan_against_runs.py)",
        "calibration": calibration,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "machine": "shared with other work; load averages beside each run",
        "runs": runs,
    }
    with open(args.record, "w") as f:
        json.dump(found, f, indent=1)
        f.write("\n")


def table(path: str) -> None:
    # here: the measuring half needs no planner (nor torch) in this process
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from test_plan_nodes import (
        predicted_step,  # the test's own pricing of a record
        recorded,
    )

    ratios = []
    print(
        "| link | fill | layout | predicted | measured (min / median / max) | ratio | "
        "load before / during, cores other jobs used |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for run, calibration in recorded(path):
        pred = predicted_step(run, calibration)
        ratio = pred / run["median"]
        ratios.append(ratio)
        miss = " (miss: see the record's cause)" if "miss" in run else ""
        print(
            f"| {run['link']} | {run['fill']} | {run['layout']} | {pred * 1e3:.0f} ms | "
            f"{run['min'] * 1e3:.0f} / {run['median'] * 1e3:.0f} / {run['max'] * 1e3:.0f} ms | "
            f"{ratio:.2f}{miss} | {run['load_before']} / {run['load_during']}, "
            f"others {run['others_cores']} |"
        )
    ratios.sort()
    print(
        f"\npredicted / measured over {len(ratios)} runs: min {ratios[0]:.2f}, "
        f"median {statistics.median(ratios):.2f}, max {ratios[-1]:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", metavar="JSON", help="run every layout and write the runs")
    parser.add_argument("--table", metavar="JSON", help="price the recorded runs and compare")
    parser.add_argument("--calibrate", action="store_true", help="only print the calibration")
    parser.add_argument("--links", nargs="+", default=list(LINKS), choices=list(LINKS))
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument(
        "--only", nargs="+", default=[], metavar="LINK:FILL:LAYOUT",
        help="record only these runs, e.g. 2gbit:block:tp4 (a retake of a busy run)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=6, help="steps a run (the first excluded)")
    parser.add_argument(
        "--max-others", type=float, default=0.5, help="run again when other jobs used more cores"
    )
    parser.add_argument("--tries", type=int, default=2)
    parser.add_argument("--pause", type=float, default=5.0, help="seconds before a retry")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take")
    args = parser.parse_args()
    if args.calibrate:
        print(json.dumps(calibrate(), indent=1))
        return
    if not (args.record or args.table):
        parser.error("give --record JSON, --table JSON or --calibrate")
    if args.record:
        record(args)
    if args.table:
        table(args.table)


if __name__ == "__main__":
    main()
