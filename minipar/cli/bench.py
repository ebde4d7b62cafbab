"""`minipar bench`: launch one job that times the collectives, then print and save what it found.

The ranks (minipar/bench/ranks.py) write one JSON line per finished cell; this process follows
the file for the progress bar, then computes bandwidths, ratios, predictions and roofline
fractions (report.py) and prints them (table.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time

from minipar import cost, exercises, launcher
from minipar.bench import context, ddp, fit, fsdp, moe, ops, pipeline, plot, ranks, report, spec, tp
from minipar.bench.events import Follower
from minipar.launcher.cluster import link
from minipar.launcher.cluster.job import emulated

EPILOG = """\
examples:
  minipar bench all_reduce -n 2 --against mpi,torch --json out.json
  minipar bench                       all_reduce on 2 ranks at 4 sizes (about half a minute)
  minipar bench all_reduce --sizes 8B:64MiB   the full sweep, every size doubling (minutes)
  minipar bench all_reduce --sizes 8B:64MiB:x4 --algorithms ring,recursive_doubling
  minipar bench --impl exercises --algorithms student_ring,ring   your ring beside minipar's
  minipar bench all_gather,reduce_scatter --sizes 1MiB,64MiB --against mpi
  minipar bench --fit                 measure alpha, beta, gamma; store them for the cost model
  minipar bench all_reduce --plot busbw.png
  minipar bench tp                    tensor-parallel MLP and attention against torch's
  minipar bench pp                    pipeline schedules against torch.distributed.pipelining
  minipar bench ddp --repeat 5        DDP step vs torch DDP; DDP/ZeRO-1/FSDP memory per rank
  minipar bench fsdp -n 4             FSDP step vs torch's FSDP2 (fully_shard); memory per rank
  minipar bench all_reduce --algorithms ring,ring+window   a buffer in the shared window
  minipar bench cp --json cp.json     ring and Ulysses attention on 2 ranks vs dense on one
  minipar bench moe -n 4              the MoE layer at ep = 4 vs every expert local

Times are the median (min, max) over iterations of the slowest rank's time; each iteration
starts at a barrier. busbw follows nccl-tests (all-reduce: algbw x 2(n-1)/n). With more ranks
than cores the ranks take turns on a core: such numbers support no claims.
"""


def configure(parser) -> None:
    parser.description = "Time minipar's collective algorithms against MPI and torch.distributed."
    parser.epilog = EPILOG
    add = parser.add_argument
    add(
        "collective",
        nargs="?",
        default="all_reduce",
        help=f"one of {', '.join(spec.COLLECTIVES)}, a comma list, or 'all' (default all_reduce); "
        "or a strategy's step: ddp, fsdp, tp, pp",
    )
    add("-n", "--ranks", type=int, default=2, help="number of ranks (default 2)")
    add(
        "--sizes",
        default=QUICK_SIZES,
        help=f"START:END[:xF] or a list (default {QUICK_SIZES}; the full sweep: 8B:64MiB)",
    )
    add("--dtype", default="float32", choices=spec.DTYPES)
    add("--algorithms", default="all", help="comma list of minipar algorithms, or 'all'")
    add(
        "--impl",
        metavar="DIR",
        default=None,
        help="a folder of exercises (as minipar grade --impl): the ones you wrote are timed "
        "too, as student_ring, student_recursive_doubling, ...",
    )
    add(
        "--against",
        default="mpi,torch",
        help="references: mpi,torch (default), mpi, torch, or none",
    )
    add("--iters", type=int, default=None, help="iterations per cell (default: adapt to size)")
    add("--warmup", type=int, default=2, help="warm-up calls per cell (default 2)")
    add("--budget", type=float, default=0.05, help="seconds of timed calls per cell (default 0.05)")
    add("--json", metavar="PATH", help="write one record per row as a JSON list")
    add("--plot", metavar="PATH.png", help="draw busbw against size (matplotlib)")
    add("--fit", action="store_true", help="measure this machine's alpha, beta, gamma first")
    add("--fit-path", default=None, help="where --fit stores the link (default: user cache)")
    add(
        "--repeat", type=int, default=1, help="run the whole job R times; goals show min-median-max"
    )
    add("--timeout", type=float, default=900, help="seconds before the whole job is killed")
    add(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="run on N emulated nodes (as minipar run --nodes; root): the rows cross their link",
    )
    add("--link", default=None, help="the link between emulated nodes: 2gbit (default), 500mbit")


QUICK_SIZES = "8B,64KiB,1MiB,16MiB"  # the default: a latency, a middle and two bandwidth sizes


def default_fit_path() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "minipar", "link.json")


def job_spec(args) -> dict:
    """The ranks' instructions, validated here so a typo fails before anything launches."""
    # here, not at the top of the file: numpy loads only when used
    from minipar.collectives import registry
    from minipar.collectives.fast import routing

    if getattr(args, "link", None) and not getattr(args, "nodes", None):
        raise ValueError("--link shapes emulated nodes: give --nodes N too")
    if getattr(args, "nodes", None) is not None and args.nodes < 1:
        raise ValueError(f"--nodes {args.nodes}: give at least 1 node")
    collectives = spec.parse_collectives(args.collective)
    against = [] if args.against in ("none", "") else args.against.split(",")
    for impl in against:
        if impl not in ("mpi", "torch"):
            raise ValueError(f"--against takes mpi and/or torch, got {impl!r}")
    impl = student_algorithms(getattr(args, "impl", None))
    known = {
        c: registry.algorithms(c) + routing.bench_variants(c) + ops.window_variants(c)
        for c in collectives
    }
    algorithms = {}
    for c in collectives:
        wanted = known[c] if args.algorithms == "all" else args.algorithms.split(",")
        algorithms[c] = [a for a in wanted if a in known[c]]
    if args.algorithms != "all":
        unknown_algorithms(args.algorithms.split(","), collectives, known, impl)
    return {
        "collectives": collectives,
        "sizes": spec.parse_sizes(args.sizes),
        "dtype": args.dtype,
        "algorithms": algorithms,
        "against": against,
        "iters": args.iters,
        "warmup": args.warmup,
        "budget": args.budget,
        "fit": bool(args.fit),
        "fit_path": os.path.abspath(args.fit_path or default_fit_path()),
        "impl": os.path.abspath(args.impl) if impl is not None else None,
        # the emulated link's rate, bytes/s (None: one node, or unlimited): its roofline
        "link_Bps": (link.parse(args.link or link.DEFAULT) or 0) / 8 or None
        if getattr(args, "nodes", None)
        else None,
    }


def student_algorithms(folder):
    """The names `--impl DIR` adds (minipar.exercises.register: only the exercises written
    there), registered here too so --algorithms can name them; None without --impl."""
    if folder is None:
        return None
    if not os.path.isdir(folder):
        raise ValueError(f"--impl {folder}: no such folder; give your exercises' folder")
    try:
        return exercises.register(folder)
    except Exception as error:  # the student's file: a SyntaxError, an import that fails
        raise ValueError(f"--impl {folder}: {type(error).__name__}: {error} (minipar grade "
                         "shows where)") from error  # fmt: skip


def unknown_algorithms(names, collectives, known, impl) -> None:
    """A name in --algorithms that no collective asked for has: refused, naming it and the
    valid ones (a student's, student_*, come with --impl)."""
    valid = list(dict.fromkeys(a for c in collectives for a in known[c]))
    for name in names:
        if name in valid:
            continue
        if name.startswith("student_") and impl is None:
            raise ValueError(f"--algorithms {name}: yours are timed with --impl DIR (your "
                             "exercises folder), e.g. --impl exercises")  # fmt: skip
        if name.startswith("student_"):
            wrote = ", ".join(impl) or "none written yet"
            raise ValueError(f"--algorithms {name}: not in --impl's folder (there: {wrote}); "
                             f"valid: {', '.join(valid)}")  # fmt: skip
        raise ValueError(f"--algorithms {name}: {'/'.join(collectives)} has no such algorithm; "
                         f"valid: {', '.join(valid)}")  # fmt: skip


def cell_count(job: dict, ranks_n: int = 2) -> int:
    """The cells (table rows) the job plans: each collective's, at each size."""
    count = 0
    for c in job["collectives"]:
        for size in job["sizes"]:
            nbytes = spec.round_size(c, size, ranks_n, spec.ITEMSIZE[job["dtype"]])
            count += len(list(ranks.cells(c, job, nbytes, ranks_n)))
    return count


def launch_job(
    job: dict, n: int, timeout: float, progress=None, nodes=None, rate=None
) -> tuple[list[dict], object]:
    """Run the ranks (on `nodes` emulated nodes joined at `rate`, when given); returns (the
    events rank 0 wrote, the CompletedProcess). The job's temporary folder is removed once they
    are read, the nodes once the job ends."""
    if nodes is not None:
        with emulated(nodes, rate or link.DEFAULT) as cluster:
            return _launch(job, n, timeout, progress, cluster)
    return _launch(job, n, timeout, progress, None)


def _launch(job: dict, n: int, timeout: float, progress, cluster) -> tuple[list[dict], object]:
    folder = tempfile.mkdtemp(prefix="minipar-bench-")
    spec_path, out_path = os.path.join(folder, "job.json"), os.path.join(folder, "out.jsonl")
    try:
        with open(spec_path, "w") as f:
            json.dump(job, f)
        open(out_path, "w").close()
        os.environ.setdefault("MINIPAR_TIMEOUT", "120")
        done = []
        argv = ["-m", "minipar.bench.ranks", spec_path, out_path]
        worker = threading.Thread(
            target=lambda: done.append(
                launcher.run(n, argv, timeout=timeout, capture=True, cluster=cluster)
            )
        )
        worker.start()
        follow = Follower(out_path)  # new records only, a half-written one kept
        while worker.is_alive():
            worker.join(0.2)
            if progress is not None:
                progress(follow.read())
        return _read(out_path), done[0]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _read(path: str) -> list[dict]:
    """A finished job's records; a line that is not one (never written by the ranks' Writer)
    left out, with a warning, not raised."""
    follow = Follower(path)
    found = follow.read()
    if follow.unreadable:
        print(f"minipar bench: {follow.unreadable} unreadable lines in {path} left out",
              file=sys.stderr)  # fmt: skip
    return found


def run_with_progress(job: dict, args, console) -> tuple[list[dict], object]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("benchmarking", total=cell_count(job, args.ranks))

        def progress(events):
            cells = [e for e in events if e["type"] in ("row", "skip")]
            if cells:
                what = f"{cells[-1]['collective']} {spec.format_size(cells[-1]['nbytes'])}"
                bar.update(task, completed=len(cells), description=f"benchmarking {what}")

        return launch_job(job, args.ranks, args.timeout, progress, args.nodes, args.link)


def records(job: dict, events: list[dict], link) -> list[dict]:
    return report.records(events, job["dtype"], link, job.get("link_Bps"))


def show(console, job: dict, runs: list[list[dict]], link) -> list[list[dict]]:
    """Print the header and tables of the last run, skips, the fit, and the goals over every
    run; return each run's records."""
    # here, not at the top of the file: rich loads only when used
    from minipar.bench import table

    events = runs[-1]
    head = next(e for e in events if e["type"] == "header")
    rows = [records(job, run, link) for run in runs]
    table.header(console, head, link.name, link.source)
    if len(runs) > 1:
        console.print(f"the tables show the last of {len(runs)} runs; the goals, all of them")
    for collective in job["collectives"]:
        table.rows_table(console, rows[-1], collective)
    for e in events:
        if e["type"] == "skip":
            where = f"{e['implementation']} {e['collective']} {spec.format_size(e['nbytes'])}"
            console.print(f"[yellow]skipped[/] {where}: {e['reason']}")
    fitted = next((e for e in runs[0] if e["type"] == "fit"), None)
    if fitted:
        table.fit_panel(console, fitted, rows[0], link)
    table.goals_table(console, rows, head["oversubscribed"])
    table.goals_table(console, rows, head["oversubscribed"], basis="min")
    return rows


def run_all(job: dict, args, console):
    """args.repeat jobs (the fit, if asked, in the first); (runs' events, failure message)."""
    runs = []
    for i in range(max(1, args.repeat)):
        events, proc = run_with_progress(dict(job, fit=job["fit"] and i == 0), args, console)
        if not any(e["type"] == "done" for e in events):
            return runs, f"the job failed (exit {proc.returncode}):\n{(proc.stderr or '')[-4000:]}"
        if job["fit"] and i == 0:
            os.environ[cost.LINK_ENV] = job["fit_path"]  # later runs' `auto` prices with the fit
            if any("shm_alpha" in e for e in events if e["type"] == "fit"):
                os.environ[cost.SHM_LINK_ENV] = fit.shm_path(job["fit_path"])
            if any("inter_alpha" in e for e in events if e["type"] == "fit"):
                os.environ[cost.INTER_LINK_ENV] = fit.inter_path(job["fit_path"])
        runs.append(events)
    return runs, None


def main(args) -> int:
    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    if args.collective in ("tp", "pp", "cp", "moe") and (args.nodes or args.link):
        print(f"minipar bench {args.collective}: --nodes/--link are for the collectives, ddp "
              "and fsdp; this one runs on one node", file=sys.stderr)  # fmt: skip
        return 2
    if args.collective == "ddp":  # a training step, not a collective: its own module
        return ddp.main(args)
    if args.collective == "fsdp":  # the sharded step against torch's FSDP2: bench/fsdp.py
        return fsdp.main(args)

    if args.collective == "tp":  # tensor-parallel layers, not a collective: bench/tp.py
        return tp.main(args)
    if args.collective == "cp":  # context-parallel attention: bench/context.py
        return context.main(args)
    if args.collective == "moe":  # the expert-parallel layer: bench/moe.py
        return moe.main(args)
    console = Console()
    if not console.is_terminal:  # a file or a pipe: room for every column
        console.width = max(console.width, 150)
    if args.collective == "pp":  # pipeline schedules: their own job (minipar/bench/pipeline.py)
        return pipeline.main(args)
    try:
        job = job_spec(args)
    except ValueError as error:
        console.print(f"[red]minipar bench: {error}[/]")
        return 2
    start = time.monotonic()
    runs, failure = run_all(job, args, console)
    if failure:
        console.print(f"[red]minipar bench: {failure}[/]", highlight=False)
        return 1
    fitted = next((e for e in runs[0] if e["type"] == "fit"), None)
    link = fit.as_link(fitted) if fitted else cost.default_link()
    rows = show(console, job, runs, link)
    console.print(f"[dim]{sum(map(len, rows))} rows in {time.monotonic() - start:.0f} s[/]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(r, repeat=i) for i, run in enumerate(rows) for r in run], f, indent=1)
        console.print(f"wrote {args.json}")
    if args.plot:
        plot.busbw(rows[-1], args.plot, next(e for e in runs[-1] if e["type"] == "header"))
        console.print(f"wrote {args.plot}")
    return 0
