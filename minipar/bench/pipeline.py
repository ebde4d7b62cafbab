"""`minipar bench pp`: pipeline schedules' step time beside torch.distributed.pipelining's.

    minipar bench pp                 # p = 2 and 4, m = 8, every schedule, GPipe/1F1B of torch
    minipar bench pp --repeat 3      # each job three times: min / median / max over the runs

One MPI job per pipeline size. In it every rank builds the same model (stages of Linear+ReLU),
takes its stage, and times full training steps (forward, backward, gradients in place; no
optimizer) of minipar's gpipe, 1f1b, interleaved (2 chunks per rank) and zb-h1, and of
torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B over gloo on the same stages and
micro-batches. A step's time is the slowest rank's, each step starting at a barrier; a row
reports min, median and max over the steps. Beside it: the bubble measured from the last step's
timeline, the verifier's prediction with the measured mean cost of each instruction kind, and
the textbook formula for equal stages. With --repeat R every job runs R times (p = 2, 4, 2, 4,
...): the table then shows, per schedule, min / median / max over the runs of each run's median
step, and of its ratio to torch's 1F1B in the same run; `--json` has one row per schedule and
run (`repeat` numbers the run).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

import minipar
from minipar import launcher

WIDTH, LAYERS_PER_STAGE, BATCH, M, STEPS = 512, 2, 256, 8, 7
OURS = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)]
THEIRS = ["GPipe", "1F1B"]


def main(args) -> int:
    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 130)
    rows = []
    for repeat in range(max(1, args.repeat)):
        for p in (2, 4):
            out = os.path.join(tempfile.mkdtemp(prefix="minipar-bench-pp-"), "rows.json")
            argv = ["-m", "minipar.bench.pipeline", out]
            done = launcher.run(p, argv, timeout=args.timeout, capture=True)
            if done.returncode or not os.path.exists(out):
                tail = (done.stderr or "")[-3000:]
                console.print(f"[red]minipar bench pp: p={p} failed[/]\n{tail}")
                return 1
            with open(out) as f:
                rows += [dict(r, repeat=repeat, load=os.getloadavg()[0]) for r in json.load(f)]
            os.remove(out)
            os.rmdir(os.path.dirname(out))
    show(console, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        console.print(f"wrote {args.json}")
    return 0


def show(console, rows) -> None:
    """One line per (p, schedule): over the runs, min / median / max of each run's median step
    and of its ratio to torch's 1F1B in the same run; the last run's bubbles."""
    from rich.table import Table

    cores = os.cpu_count() or 1
    runs = 1 + max(r.get("repeat", 0) for r in rows)
    loads = sorted({round(r["load"], 1) for r in rows if "load" in r})
    table = Table(title=f"pipeline step, m={M}, {WIDTH}-wide Linear stages, batch {BATCH}, "
                  f"{runs} run{'s' * (runs > 1)}" + (f", load {loads[0]}-{loads[-1]}" if loads
                                                     else ""))  # fmt: skip
    for col in ("p", "schedule", "step ms min", "median", "max", "vs torch 1F1B min / med / max",
                "bubble measured", "predicted", "formula"):  # fmt: skip
        table.add_column(col, justify="right")
    for (p, name), mine in _by_schedule(rows).items():
        medians = [r["times"][1] for r in mine]
        ratios = []
        for r in mine:
            ref = next(x for x in rows if x["p"] == p and x["schedule"] == "torch 1F1B"
                       and x.get("repeat", 0) == r.get("repeat", 0))  # fmt: skip
            ratios.append(r["times"][1] / ref["times"][1])
        last = mine[-1]
        table.add_row(
            str(p), name, *(f"{1e3 * t:.1f}" for t in (min(medians), statistics.median(medians),
                                                        max(medians))),
            " / ".join(f"{x:.2f}x" for x in (min(ratios), statistics.median(ratios), max(ratios))),
            *(f"{last[k]:.1%}" if last.get(k) is not None else "" for k in
              ("measured", "predicted", "formula")),
        )  # fmt: skip
    console.print(table)
    if any(r["p"] > cores for r in rows):
        console.print(f"[yellow]p=4 on {cores} cores is oversubscribed: ranks take turns[/]")


def _by_schedule(rows) -> dict:
    """{(p, schedule): its rows, one per run, in run order}."""
    out: dict = {}
    for r in rows:
        out.setdefault((r["p"], r["schedule"]), []).append(r)
    return out


# -- the ranks' side --------------------------------------------------------------------------
def _model(p: int, v: int):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    layers = [m for _ in range(p * LAYERS_PER_STAGE) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())]
    return nn.Sequential(*layers[:-1])  # stages cut on layer count: p*v stages


def _time_steps(w, step) -> list[float]:
    step()  # warm-up
    times = []
    for _ in range(STEPS):
        w.barrier()
        start = time.perf_counter()
        step()
        times.append(max(w.allgather_object(time.perf_counter() - start)))
    return [min(times), statistics.median(times), max(times)]


def _ours(w, name: str, v: int, x, y) -> dict:
    import torch.nn.functional as F

    # here, not at the top of the file: torch and numpy load only when used
    from minipar.parallel.pipeline import Pipeline, Timeline, split
    from minipar.parallel.pipeline import schedules as S
    from minipar.parallel.pipeline import verify as V

    p, r = w.size, w.rank
    stages = split(_model(p, v), p * v)
    mine = stages[r::p] if v > 1 else stages[r]
    pipe = Pipeline(mine, n_microbatches=M, schedule=name, loss_fn=F.mse_loss, virtual_stages=v)
    times = _time_steps(w, lambda: pipe.step(x, y))
    timeline = Timeline.gather(pipe)
    mean = _mean_costs(timeline)
    predicted = V.verify(S.program(name, p, M, v), lambda rank, ins: mean[rank][_letter(ins)])
    return {
        "schedule": name, "times": times, "measured": timeline.bubble_fraction,
        "predicted": predicted.bubble_fraction, "formula": V.predicted_bubble(name, p, M, v),
    }  # fmt: skip


def _letter(ins) -> str:
    # here, not at the top of the file: torch and numpy load only when used
    from minipar.parallel.pipeline.timeline import LETTERS

    return LETTERS[type(ins).__name__]


def _mean_costs(timeline) -> list[dict]:
    """Per rank, the mean measured seconds of each instruction kind."""
    out = []
    for row in timeline.rows:
        kinds: dict = {}
        for kind, _, _, s, e in row:
            kinds.setdefault(kind, []).append(e - s)
        out.append({k: statistics.mean(v) for k, v in kinds.items()})
    return out


def _theirs(w, kind: str, x, y) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    # here, not at the top of the file: torch and numpy load only when used
    from minipar.parallel.pipeline import split

    p, r = w.size, w.rank
    stage = PipelineStage(split(_model(p, 1), p)[r], r, p, torch.device("cpu"))
    cls = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}[kind]
    sched = cls(stage, n_microbatches=M, loss_fn=F.mse_loss)

    def step():
        if r == 0:
            sched.step(x)
        elif r == p - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()

    return {"schedule": f"torch {kind}", "times": _time_steps(w, step)}


def ranks_main(out: str) -> None:
    import torch
    from mpi4py import MPI

    # here, not at the top of the file: numpy loads only when used
    from minipar.comm.transport.torch import init_from_mpi

    w = minipar.init()
    init_from_mpi(MPI.COMM_WORLD)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
    rows = [_ours(w, name, v, x, y) for name, v in OURS]
    rows += [_theirs(w, kind, x, y) for kind in THEIRS]
    if w.rank == 0:
        with open(out, "w") as f:
            json.dump([dict(r, p=w.size) for r in rows], f)
    w.barrier()


if __name__ == "__main__":
    ranks_main(sys.argv[1])
