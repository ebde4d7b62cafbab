"""`minipar simulate`: the unchanged collectives on a simulated cluster of thousands of ranks.

    minipar simulate all_reduce --ranks 1024 --per-node 8 --cluster h100 --sizes 1MiB:4GiB
    all_reduce_sweep(1024, preset("h100"), sizes, ["ring", "tree"])   # the same, as data

The simulator is minipar.simulate (its docstrings say what a message costs and how the ranks
run); this module is the command's face: an nccl-tests-style table, one row per size and
algorithm, with the cost model's prediction beside the simulated time, and --json.
"""

from __future__ import annotations

import json

from minipar.bench.spec import parse_sizes
from minipar.planning.planner import CLUSTERS, ModelSpec, best, plan_layouts
from minipar.simulate import cluster as clusters
from minipar.simulate import plot
from minipar.simulate import validate as check
from minipar.simulate.sweep import all_reduce_sweep, available, known
from minipar.term import Console

DEFAULT_ALGORITHMS = "ring,tree,double_tree,hierarchical"

EXAMPLES = f"""\
examples:
  minipar simulate all_reduce --ranks 1024 --per-node 8 --cluster h100 --sizes 1MiB:4GiB
  minipar simulate all_reduce --ranks 64 --cluster b200 --sizes 8B:1GiB:x8 --algorithms ring,tree
  minipar simulate all_reduce --ranks 4096 --algorithms double_tree --sizes 1GiB
  minipar simulate all_reduce --ranks 256 --sizes 8B:1GiB:x8 --plot busbw.png
  minipar simulate all_reduce --ranks 8 --sizes 8B:8GiB:x8 --algorithms nccl
  minipar simulate all_reduce --ranks 16 --sizes 1GiB --algorithms rings --protocol LL128
  minipar simulate validate
  minipar simulate all_reduce --ranks 16 --link alpha=5us,bw=25GB/s --sizes 1MiB --json out.json
  minipar simulate train --model 70b --gpus 1024 --cluster h100 --trace step.json

clusters: {", ".join(c.describe() for c in clusters.PRESETS.values())}.
--link gives one link class inside and across nodes (alpha per message, bw one way).
--protocol prices NCCL's protocols (Simple, LL, LL128; nccl: its pick) as its tuner does;
--algorithms nccl runs NCCL's pick of algorithm and protocol for each size.
Each rank is a thread of this process with a virtual clock (minipar/simulate/); the data is
real but scaled (p float32 elements standing for the size), and every result is checked.
A 1,024-rank ring takes about 2 million messages: tens of seconds a size.
"""


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    parser.add_argument(
        "what",
        choices=["all_reduce", "train", "validate"],
        help="what to simulate (validate: every published NCCL figure, simulated / published)",
    )
    parser.add_argument("--ranks", type=int, default=64, help="ranks in the world (default 64)")
    parser.add_argument("--per-node", type=int, default=None, help="ranks a node (default 8)")
    parser.add_argument(
        "--cluster", default=None, choices=list(clusters.PRESETS), help="preset (default h100)"
    )
    parser.add_argument("--link", default=None, help="your own link: alpha=5us,bw=25GB/s")
    parser.add_argument("--nics", type=int, default=None, help="NICs a node (with --link)")
    parser.add_argument("--sizes", default="1MiB:1GiB:x4", help="bytes: 1MiB:4GiB, 8B:1GiB:x8")
    parser.add_argument("--algorithms", default=DEFAULT_ALGORITHMS, help="comma-separated")
    parser.add_argument(
        "--protocol",
        default=None,
        help="NCCL's protocols: nccl (its pick per size), LL, LL128 or Simple (default: none, "
        "the links as given; --algorithms nccl picks one)",
    )
    parser.add_argument(
        "--no-contention", action="store_true", help="messages never queue for a port"
    )
    parser.add_argument("--json", metavar="PATH", help="write one record per row as a JSON list")
    parser.add_argument("--plot", metavar="PATH", help="busbw against size, as a PNG (matplotlib)")
    train = parser.add_argument_group("train: one step of the layout `minipar plan` proposes")
    train.add_argument("--model", default="7b", help="model preset of minipar plan (default 7b)")
    train.add_argument("--gpus", type=int, default=64, help="GPUs in all (default 64)")
    train.add_argument("--trace", metavar="PATH", help="the step's timeline (Perfetto JSON)")


def build_cluster(args):
    """The cluster the arguments name: --link (one class) or a preset, with --per-node."""
    if args.link is not None and args.cluster is not None:
        raise ValueError("give --cluster or --link, not both")
    if args.link is not None:
        return clusters.custom(clusters.parse_link(args.link), args.per_node or 8, args.nics)
    if args.nics is not None:
        raise ValueError("--nics goes with --link (a preset has its own NICs)")
    cluster = clusters.preset(args.cluster or "h100")
    return cluster if args.per_node is None else cluster.with_per_node(args.per_node)


def main(args) -> int:
    console = Console()
    if args.what == "train":
        return train(args, console)
    if args.what == "validate":
        return validate(console)
    try:
        clusters.check_count(args.ranks, "--ranks")
        cluster = build_cluster(args)
        sizes = parse_sizes(args.sizes)
        if min(sizes) < 1:
            raise ValueError(f"--sizes {args.sizes!r}: every size must be at least 1 byte")
        asked = [a.strip() for a in args.algorithms.split(",") if a.strip()]
        if not asked:
            raise ValueError("--algorithms is empty")
        names, missing = available(asked)
        if missing:  # every name checked before any rank is simulated
            raise ValueError(
                f"--algorithms: no all_reduce algorithm named {', '.join(map(repr, missing))}; "
                f"choose from {', '.join(known())}"
            )
    except ValueError as error:
        console.print(f"[bold red]minipar simulate:[/] {error}", highlight=False, soft_wrap=True)
        return 2
    console.print(
        f"all_reduce on {args.ranks} simulated ranks, {cluster.describe()}", highlight=False
    )
    rows = []
    console.print(HEADER, highlight=False, soft_wrap=True)
    sweep = all_reduce_sweep(
        args.ranks, cluster, sizes, names, not args.no_contention, args.protocol
    )
    try:
        first = next(sweep, None)
    except ValueError as error:
        console.print(f"[bold red]minipar simulate:[/] {error}", highlight=False)
        return 2
    for row in [first, *sweep] if first is not None else []:
        rows.append(row)
        console.print(_line(row), highlight=False, soft_wrap=True)
    wrong = sum(r["wrong"] for r in rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        console.print(f"wrote {args.json}")
    if args.plot:
        plot.busbw(rows, args.plot, f"all_reduce, {args.ranks} ranks, {cluster.name}")
        console.print(f"wrote {args.plot}")
    if wrong:
        console.print(f"[bold red]{wrong} rank results differ from the exact sum[/]")
        return 1
    return 0


HEADER = (
    f"{'size':>10} {'algorithm':>14} {'proto':>6} {'time (us)':>12} {'algbw GB/s':>11} "
    f"{'busbw GB/s':>11} {'model (us)':>11} {'messages':>10} {'wall s':>7} {'wrong':>5}"
)


def _line(row: dict) -> str:
    predicted = row["predicted_s"]
    model = f"{predicted * 1e6:11.1f}" if predicted is not None else f"{'-':>11}"
    return (
        f"{_size(row['nbytes']):>10} {row['algorithm']:>14} {row['protocol'] or '-':>6} "
        f"{row['time_s'] * 1e6:12.1f} "
        f"{row['algbw_GBps']:11.2f} {row['busbw_GBps']:11.2f} {model} {row['messages']:>10} "
        f"{row['wall_s']:7.2f} {row['wrong']:>5}"
    )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def validate(console) -> int:
    """Every published figure (simulate/published.py) simulated as NCCL ran it."""
    console.print(
        f"{'figure':36} {'ran':>15} {'proto':>6} {'published':>10} {'simulated':>10} "
        f"{'error':>7}  source",
        highlight=False,
        soft_wrap=True,
    )
    results, summary = check.validate()
    notes = []
    for r in results:
        unit = "us" if r["metric"] == "time_us" else "GB/s"
        note = r.get("why") or r.get("miss")
        mark = ""
        if note:
            notes.append(note) if note not in notes else None
            mark = f" ({'not held' if not r['held'] else 'miss'}: note {notes.index(note) + 1})"
        console.print(
            f"{check.describe(r):36} {r['row']['algorithm']:>15} {r['row']['protocol']:>6} "
            f"{r['value']:>6.1f} {unit:<4}{r['simulated']:>7.1f} {unit:<4}"
            f"{r['ratio'] - 1:>+7.1%}  {check.cite(r)}{mark}",
            highlight=False,
            soft_wrap=True,
        )
    for i, note in enumerate(notes, 1):
        console.print(f"  note {i}: {note}", highlight=False, soft_wrap=True)
    for line in check.table_lines(results):
        console.print(line, highlight=False, soft_wrap=True)
    worst = summary["worst_figure"]
    console.print(
        f"{summary['held']} figures held of {summary['figures']}: geometric-mean error "
        f"{summary['geomean']:.1%}, worst {summary['worst']:.1%} ({check.describe(worst)}); "
        f"{summary['wrong']} results wrong",
        highlight=False,
        soft_wrap=True,
    )
    return 1 if summary["wrong"] else 0


PLANNER_CLUSTERS = {"h100": "dgx-h100", "b200": "dgx-b200"}


def train(args, console) -> int:
    """One step of the fastest layout `minipar plan` finds, simulated: its time, bubble and
    exposed gradient all-reduce beside the planner's formulas."""
    # the pipeline's schedules come with its package, which loads torch: only `train` needs it
    from minipar.simulate import train_step

    name = args.cluster or "h100"
    try:
        if name not in PLANNER_CLUSTERS or args.link is not None:
            raise ValueError(
                f"train simulates the planner's clusters: {', '.join(PLANNER_CLUSTERS)}"
            )
        clusters.check_count(args.gpus, "--gpus")
        model = ModelSpec.preset(args.model)
    except ValueError as error:
        console.print(f"[bold red]minipar simulate:[/] {error}", highlight=False, soft_wrap=True)
        return 2
    layout = best(plan_layouts(model, CLUSTERS[PLANNER_CLUSTERS[name]], args.gpus))
    if layout is None:
        console.print(
            f"[bold red]minipar simulate:[/] no layout of {args.model} fits {args.gpus} GPUs"
        )
        return 1
    cluster = clusters.preset(name)
    step = train_step.from_layout(model, layout)
    sim = cluster.with_per_node(max(1, cluster.per_node // layout.tp))
    run = train_step.simulate_step(step, sim)
    console.print(
        f"{args.model} on {args.gpus} GPUs of {name}: dp {layout.dp} x tp {layout.tp} x pp "
        f"{layout.pp}, {layout.microbatches} micro-batches of {layout.micro_batch} "
        f"({step.dp * step.pp} simulated ranks: a tp group is one)",
        highlight=False,
        soft_wrap=True,
    )
    rows = [
        ("step (s)", run.time, layout.step_time),
        ("bubble (share)", run.bubble, run.predicted_bubble),
        ("dp all-reduce after backward (s)", run.exposed_comm, layout.time["dp_total"]),
    ]
    console.print(f"{'':28}{'simulated':>12}{'planner':>12}", highlight=False, soft_wrap=True)
    for what, simulated, planned in rows:
        console.print(f"{what:28}{simulated:12.4g}{planned:12.4g}", highlight=False, soft_wrap=True)
    console.print(
        "The simulated step runs the gradient all-reduce after the last backward; the planner "
        f"hides all but {layout.time['dp_comm']:.3g} s of it behind backward (DDP's buckets).",
        highlight=False,
        soft_wrap=True,
    )
    if args.trace:
        train_step.write_timeline(run, args.trace)
        console.print(f"wrote {args.trace} (open it in ui.perfetto.dev)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"what": w, "simulated": s, "planner": p} for w, s, p in rows], f, indent=1)
    return 0
