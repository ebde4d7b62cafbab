"""Lesson 12: failures at scale (text: lessons/12_failures_at_scale.md).

    minipar lesson 12 --quick         # the predictions, and a save's cost measured here
    minipar lesson 12                 # ... and a training run with ranks killed at random

From a published failure rate (Meta's Llama 3 report: 419 unexpected interruptions in 54 days
on 16,384 H100s) to the mean time between interruptions of a job of G GPUs, the checkpoint
interval that loses the least (Young and Daly: about sqrt(2 x checkpoint cost x MTBI)) and the
goodput; then measured: what a sharded save costs a step here, blocking and overlapped, and
(full mode) a real `minipar train` under `minipar run --max-restarts` with ranks killed at a
rate scaled down to seconds, its goodput against the prediction. Every prediction is a claim
(minipar/course/claims.py): the intervals judged as values, the save's cost and the goodput as
timings (the save's a ratio within each run; the goodput shown, not judged, where the run did
not get its cores); `--json FILE` keeps them.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from minipar.course import claims as C
from minipar.course.lessons.page import Page
from minipar.models.config import GPTConfig, RunSpec

# Dubey et al., "The Llama 3 Herd of Models" (arXiv:2407.21783), section 3.3.4: a 54-day
# snapshot of pre-training on 16,384 H100 GPUs saw 419 unexpected interruptions
LLAMA3 = {"interruptions": 419, "days": 54, "gpus": 16384}
GPUS = (1024, 4096, 16384, 131072)
SAVE_COSTS = (10.0, 60.0, 300.0)  # seconds a checkpoint stops training: async, fast, slow
RESTART_S = 600.0  # seconds from a failure to training again (a scheduler's restart, a reload)
GOODPUT_TOLERANCE = C.relative(0.25)  # the goodput claim's: a timing claim, bandwidth-like
MTBI_S = 40.0  # the full run's failure rate, scaled down from hours to seconds


def mtbi_hours(gpus: int) -> float:
    """The job's mean time between interruptions, if every GPU (and its share of the host)
    fails independently at Llama 3's rate: per-GPU MTBF / G."""
    per_gpu = LLAMA3["days"] * 24 * LLAMA3["gpus"] / LLAMA3["interruptions"]
    return per_gpu / gpus


def young_daly(save_s: float, mtbi_s: float) -> float:
    """The checkpoint interval that loses the least, to first order: sqrt(2 delta M)."""
    # BEGIN ANSWER ex12_checkpoint_interval best_interval
    return math.sqrt(2 * save_s * mtbi_s)
    # END ANSWER


def goodput(interval_s: float, save_s: float, restart_s: float, mtbi_s: float) -> float:
    """The fraction of the wall clock that trains, to first order: each interval pays a save
    (delta / tau), each failure a restart and half an interval redone ((R + tau/2) / M)."""
    return max(0.0, 1 - save_s / interval_s - (restart_s + interval_s / 2) / mtbi_s)


def claims() -> list[str]:
    """Numbers lessons/12_failures_at_scale.md states; tests/test_lessons.py checks the text."""
    m = mtbi_hours(16384) * 3600
    out = [f"{mtbi_hours(16384):.2f} h", f"{mtbi_hours(131072) * 60:.0f} minutes"]
    out += [f"{young_daly(s, m) / 60:.1f} min" for s in SAVE_COSTS]
    out += [f"{goodput(young_daly(s, m), s, RESTART_S, m):.1%}" for s in SAVE_COSTS]
    return out


def rates_section(page: Page) -> None:
    page.prediction("the mean time between interruptions of a job of G GPUs")
    page.say(
        f"Llama 3: {LLAMA3['interruptions']} unexpected interruptions in {LLAMA3['days']} days "
        f"on {LLAMA3['gpus']:,} GPUs: one every {mtbi_hours(LLAMA3['gpus']):.2f} h, a per-GPU "
        f"MTBF of {mtbi_hours(1) / 24 / 365:.1f} years. A job's MTBI is that divided by G."
    )
    rows = [(f"{g:,}", f"{mtbi_hours(g):.2f} h") for g in GPUS]
    page.table(None, ["GPUs>", "MTBI>"], rows)


def interval_section(page: Page) -> None:
    m = mtbi_hours(16384) * 3600
    page.prediction(f"the checkpoint interval on 16,384 GPUs (restart {RESTART_S / 60:.0f} min)")
    rows, scans = [], []
    for save in SAVE_COSTS:
        best = young_daly(save, m)
        scan = max((goodput(t, save, RESTART_S, m), t) for t in range(60, 4 * 3600, 10))
        scans.append((save, best, scan[1]))
        rows.append((f"{save:g} s", f"{best / 60:.1f} min", f"{scan[1] / 60:.1f} min",
                     f"{goodput(best, save, RESTART_S, m):.1%}",
                     f"{goodput(3600, save, RESTART_S, m):.1%}"))  # fmt: skip
    page.table(None, ["save>", "sqrt(2 delta M)>", "best of a scan>", "goodput>",
                      "goodput, hourly>"], rows)  # fmt: skip
    for save, best, scanned in scans:  # the first-order formula against a 10 s scan of tau
        page.claim(f"delta {save:g} s: the scanned best interval is sqrt(2 delta M)'s",
                   best / 60, scanned / 60, "min", C.relative(0.05), "value",
                   basis="Young, first order")  # fmt: skip
    page.say(
        "An hourly checkpoint wastes more than the optimum's; a save ten times faster (written "
        "by a thread while training goes on) moves the optimum in by sqrt(10)."
    )


SAVE_CLAIM = "an overlapped save costs a step less than a blocking one"
MEASURED_REFERENCE = C.MEASURED_REFERENCE


def save_cost_section(page: Page) -> dict:
    """A sharded save's cost to a step on this machine, overlapped and blocking (1 rank): a
    saving step over a plain one, each mode in a run of its own."""
    page.measurement("what a sharded save costs a step here (the tiny GPT, 1 rank)")
    seen = {mode: _save_cost(blocking=mode == "blocking") for mode in ("overlapped", "blocking")}
    rows = [(mode, f"{s['step'] * 1e3:.1f} ms", _lost(s), f"{s['ratio']:.2f}x")
            for mode, s in seen.items()]  # fmt: skip
    page.table(None, ["save", "plain step>", "a saving step loses>", "saving / plain>"], rows)
    over, block = seen["overlapped"], seen["blocking"]
    for mode, s in seen.items():
        page.observe(f"plain step, {mode} run", s["step"], "s")
    # the reference is the blocking save's ratio, measured: the overlapped one at most that.
    # Each is a ratio within its own run (a saving step over a plain one), so a steady load
    # cancels in both
    page.claim(f"{SAVE_CLAIM} (a saving step / a plain one)", block["ratio"], over["ratio"], "x",
               C.at_most(), bound=(0.0, math.inf),
               basis=f"{MEASURED_REFERENCE}: the blocking save's ratio",
               reference="the blocking save's saving / plain step, in a run of its own",
               causes=[_jitter_cause(over, block)])  # fmt: skip
    return seen


def _lost(seen: dict) -> str:
    """What a saving step loses, as the table shows it: a median below the plain steps' is no
    negative cost, it is a cost too small to see beside their spread."""
    if seen["lost"] >= 0:
        return f"{seen['lost'] * 1e3:.1f} ms"
    return f"none seen ({seen['lost'] * 1e3:.1f} ms, within the spread)"


def _jitter_cause(over: dict, block: dict) -> str:
    """When the two saving steps differ by less than the plain steps' own spread, the spread
    (measured) explains an overlapped save that came out no cheaper."""
    gap = abs(over["lost"] - block["lost"])
    jitter = max(over["jitter"], block["jitter"])
    if gap > jitter:
        return ""
    return (
        f"the saves' costs differ by {gap * 1e3:.1f} ms, within the plain steps' spread "
        f"({jitter * 1e3:.1f} ms standard deviation): too little written to tell them apart"
    )


def _save_cost(blocking: bool, steps: int = 13, every: int = 3) -> dict:
    # here, not at the top of the file: torch loads only when the section runs
    from minipar.models import training
    from minipar.models.checkpoint_saver import ShardedSaver

    spec = RunSpec(steps=steps, model=GPTConfig(n_layers=2))
    mesh = training.mesh_for(spec)
    root = tempfile.mkdtemp(prefix="minipar-l12-")
    saver = ShardedSaver(root, mesh, spec, keep=1, blocking=blocking)
    times = []

    def after(step, part, opt):
        if (step + 1) % every == 0:
            saver.save(step + 1, part, opt, {})

    try:
        training.train_on_mesh(spec, mesh, lambda s, loss, t: times.append(t), after_step=after)
        saver.finish()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    saving = [t for i, t in enumerate(times) if i and (i + 1) % every == 0]
    plain = [t for i, t in enumerate(times) if i and (i + 1) % every]
    step = statistics.median(plain)
    lost = statistics.median(saving) - step
    return {"step": step, "lost": lost, "ratio": (step + lost) / step,
            "jitter": statistics.pstdev(plain)}  # fmt: skip


def replay(fault_times, restart_s, step_s, every, steps, teardown_s=0.0) -> float:
    """The wall clock of a run of `steps` steps (each step_s, a checkpoint every `every`) whose
    attempt i is cut at fault_times[i] seconds after its start (each attempt first pays
    restart_s, or restart_s[i] when it is a list, its last for the attempts after; a cut one
    then teardown_s): the work since the last checkpoint is lost."""
    starts = list(restart_s) if isinstance(restart_s, (list, tuple)) else [restart_s]
    done, wall = 0, 0.0
    for i, cut in enumerate(fault_times):
        r = starts[min(i, len(starts) - 1)]
        if r + (steps - done) * step_s <= cut:
            break  # the run ends before this fault would have fired
        progressed = max(0, int((cut - r) / step_s))
        done += progressed // every * every
        wall += cut + teardown_s
    else:
        i = len(fault_times)
    return wall + starts[min(i, len(starts) - 1)] + (steps - done) * step_s


def daly_expected(work_s, interval_s, save_s, restart_s, mtbi_s) -> float:
    """Daly's expected wall clock for exponential failures (FGCS 2006, his eq. for the
    complete model): M e^(R/M) (e^((tau + delta)/M) - 1) per interval of work."""
    m = mtbi_s
    return work_s / interval_s * m * math.exp(restart_s / m) * math.expm1((interval_s + save_s) / m)


def restarts_section(page: Page) -> None:
    """Full mode: the same training with and without ranks killed at random."""
    mtbi, steps, every = MTBI_S, 300, 20
    page.measurement(f"failures at one per {mtbi:g} s (ranks killed), {steps} steps")
    seen = page.gather(_restart_run(mtbi, steps, every) if page.rank == 0 else None)[0]
    base, hit = seen["baseline"], seen["faulty"]
    step = base["step"] + base["save_lost"] / every  # a save's cost spread over its interval
    restart, work = base["startup"], steps * base["step"]
    fired = [a["fault_at"] for a in hit["attempts"] if a["fault_at"] is not None]
    teardown = statistics.median(
        [a["ended"] - a["began"] - a["fault_at"] for a in hit["attempts"] if a["fault_at"]] or [0]
    )
    predicted = work / replay(fired, restart, step, every, steps, teardown)
    daly = work / (restart + daly_expected(work, every * step, 0.0, restart, mtbi))
    measured = work / hit["wall"]
    page.table(None, ["", "value>"], [
        ("step, median (no faults)", f"{base['step'] * 1e3:.0f} ms"),
        ("a save's cost, spread over its interval", f"{base['save_lost'] / every * 1e3:.1f} ms"),
        (f"interval tau (every {every} steps)", f"{every * step:.1f} s"),
        ("start-up and resume R", f"{restart:.1f} s"),
        ("restarts", f"{len(hit['restarts'])}"),
        ("steps done twice", f"{sum(r.get('steps_lost', 0) for r in hit['restarts'])}"),
        ("wall, with failures", f"{hit['wall']:.1f} s"),
        ("goodput, Daly's expectation at this MTBI", f"{daly:.1%}"),
        ("goodput predicted for these fault times", f"{predicted:.1%}"),
    ])  # fmt: skip
    for what, value, unit in [("step, median (no faults)", base["step"], "s"),
                              ("start-up and resume R", restart, "s"),
                              ("wall, with failures", hit["wall"], "s"),
                              ("restarts", len(hit["restarts"]), ""),
                              ("goodput, Daly's expectation at this MTBI", daly,
                               "fraction")]:  # fmt: skip
        page.observe(what, value, unit)
    cause = _startup_cause(hit, restart, step, every, steps, teardown, work, measured)
    page.claim("goodput with injected failures, against the replay of their fault times",
               predicted, measured, "fraction", GOODPUT_TOLERANCE, bound=(0.0, 1.0),
               basis="the faults that fired, replayed on the fault-free run's step, save and "
               "start-up", causes=[cause])  # fmt: skip
    page.check(hit["returncode"] == 0, "the run with failures finished")


def _startup_cause(hit, restart, step, every, steps, teardown, work, measured) -> str:
    """The replay again with each attempt's own measured start-up (its first step's time after
    it began) instead of the fault-free run's R: when that lands within the tolerance of the
    measurement, start-ups that varied from attempt to attempt explain the miss."""
    attempts = hit["attempts"]
    starts = [a["progress"][0][1] - a["began"] if a["progress"] else restart for a in attempts]
    fired = [a["fault_at"] for a in attempts if a["fault_at"] is not None]
    again = work / replay(fired, starts, step, every, steps, teardown)
    if not GOODPUT_TOLERANCE.holds(again, measured):
        return ""
    return (
        f"the attempts' own start-ups ({min(starts):.1f}-{max(starts):.1f} s, not the fault-free "
        f"run's {restart:.1f} s) replayed give {again:.1%}: start-ups varied"
    )


def _clean_env() -> dict:
    """This process's environment without the launch it runs in (a job of its own)."""
    drop = ("PMI_", "PMIX_", "MPI_", "OMPI_", "HYDRA_", "MPIR_", "MINIPAR_TRAIN_RANK")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _restart_run(mtbi: float, steps: int, every: int) -> dict:
    folder = tempfile.mkdtemp(prefix="minipar-l12-")
    try:
        base = _train(folder, "base", steps, every, [])
        rng = random.Random(12)
        times = [f"kill-rank:random@{rng.expovariate(1 / mtbi):.1f}s" for _ in range(12)]
        hit = _train(folder, "hit", steps, every, times)
        return {"baseline": base, "faulty": hit}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _train(folder, name, steps, every, faults) -> dict:
    log, out = os.path.join(folder, f"{name}.json"), os.path.join(folder, f"{name}-train.json")
    cmd = [sys.executable, "-m", "minipar", "run", "-n", "2", "--max-restarts", "12",
           "--restart-log", log, *sum((["--fault", f] for f in faults), []), "--fault-seed", "12",
           "-m", "minipar", "train", "--dp", "2", "--layers", "2", "--steps", str(steps),
           "--checkpoint-every", str(every), "--keep", "1", "--json", out,
           "--checkpoint-dir", os.path.join(folder, name)]  # fmt: skip
    began = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), timeout=900)
    with open(log) as f:
        account = json.load(f)
    result = {"wall": time.time() - began, "restarts": account["restarts"],
              "attempts": account["attempts"], "returncode": done.returncode}  # fmt: skip
    first = account["attempts"][0]
    if first["progress"]:
        result["startup"] = first["progress"][0][1] - first["began"]
    if os.path.exists(out):
        with open(out) as f:
            trained = json.load(f)
        times = trained["step_seconds"][1:]
        result["step"] = statistics.median(times)
        saves = {c["step"] for c in trained["checkpoints"]["saves"]}
        first_step = steps - len(trained["step_seconds"])
        saving = [t for i, t in enumerate(trained["step_seconds"]) if first_step + i + 1 in saves]
        result["save_lost"] = max(0.0, statistics.median(saving) - result["step"])
    return result


def main(argv=None) -> int:
    page = Page("12", "Failures at scale: checkpoints and restarts", argv=argv)
    rates_section(page)
    interval_section(page)
    save_cost_section(page)
    if not page.quick:
        restarts_section(page)
    page.try_this(
        [
            "minipar run -n 6 --max-restarts 3 --fault kill-rank:random@20s -m minipar train "
            "--dp 3 --tp 2 --batch-size 12 --steps 200 --checkpoint-every 10 --checkpoint-dir ck",
            "The same on 3 emulated nodes (sudo, --nodes 3) with --fault kill-node:1@step=30: "
            "dp shrinks from 3 to 2 and the run goes on.",
            "Save every step, then every 50: where does the measured goodput peak?",
            "Write the interval yourself: exercises/ex12_checkpoint_interval.py, then "
            "`minipar grade 12`.",
        ]
    )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
