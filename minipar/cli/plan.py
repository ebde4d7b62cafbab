"""`minipar plan`: the feasible (dp, tp, pp, micro-batch) layouts of a model on a cluster, with
predicted memory per GPU and step time, fastest first. The arithmetic is
minipar.planning.planner's (its docstring gives every formula and its source), the table
minipar.planning.plan_table's; this module is the command's face.

    minipar plan --model 7b --cluster dgx-h100 --gpus 8
    plan_layouts(ModelSpec.preset("7b"), CLUSTERS["dgx-h100"], gpus=8)   # the same, as data
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from minipar import launcher
from minipar.launcher.cluster import link as links
from minipar.planning.here import NAME, here_cluster, on_nodes
from minipar.planning.plan_table import short_bytes, table
from minipar.planning.planner import (
    CLUSTERS,
    GB,
    MODELS,
    Cluster,
    Layout,
    ModelSpec,
    best,
    bubble_fraction,
    measure_flops,
    plan_layouts,
    shared_cores,
    with_peak,
)

__all__ = ["plan_layouts", "best", "bubble_fraction", "ModelSpec", "Cluster", "CLUSTERS"]

EXAMPLES = f"""\
examples:
  minipar plan                                       a 7B model on one DGX H100 (8 x 80 GB)
  minipar plan --model 70b --cluster dgx-b200 --nodes 4 --zero 1
  minipar plan --params 13e9 --seq 4096 --batch 512 --gpus 64 --recompute
  minipar plan --layers 24 --hidden 2048 --heads 16 --gpus 16 --gpu-memory 40
  minipar plan --model tiny --cluster cpu --gpus 8   the tiny GPT of `minipar train` here
  minipar plan --model tiny --cluster cpu --gpus 8 --measure-flops    with this CPU's rate
  minipar plan --model tiny --cluster here --gpus 4   priced on `minipar calibrate`'s numbers
  minipar plan --model 7b --all                      also the layouts that do not fit, and why
  minipar plan --model 70b --seq 131072 --batch 16 --gpus 64 --cp 8 --recompute --zero 1
  minipar plan --model 7b --experts 8 --ep 4 --gpus 16   a mixture of 8 experts, 4 ranks each
  minipar plan --model 7b --nodes 4 --zero 3 --dp-shard 8   hybrid sharding: FSDP in a node
  minipar plan --model 7b --nodes 2 --fill cyclic    ranks dealt round the nodes: tp across
  minipar plan --model tiny --cluster cpu --gpus 4 --per-node 2 --link 200mbit --zero 3 \
      --dp-shard 2                                   `minipar run --nodes 2 -n 4 --link 200mbit`
  minipar plan --json                                the table as JSON

model presets: {", ".join(MODELS)}; clusters: {", ".join(CLUSTERS)} (presets), here (this
machine's calibration).
Memory: ZeRO paper accounting (16 bytes per parameter with Adam in mixed precision) and
Korthikanti et al. 2022 for activations; time: Megatron-LM 2021 FLOPs and bubble (p-1)/(m+p-1),
communication priced by minipar.cost; --cp and --ep are fixed degrees (the other three are
searched): activations / cp, the ring's K/V or Ulysses' all-to-alls, the MoE layers' all-to-alls
and experts / ep (minipar/planning/axes.py). See
`python -c "import minipar.planning.planner as p; help(p)"`.
"""


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    model = parser.add_argument_group("model (a preset, a parameter count, or a shape)")
    model.add_argument("--model", default=None, choices=list(MODELS), help="preset (default 7b)")
    model.add_argument("--params", type=float, help="parameter count, e.g. 7e9 (shape guessed)")
    for name, meaning in (("layers", "transformer blocks"), ("hidden", "model width"),
                          ("heads", "attention heads"), ("vocab", "vocabulary size")):  # fmt: skip
        model.add_argument(f"--{name}", type=int, help=meaning)
    model.add_argument("--seq", type=int, help="sequence length (default: the preset's)")
    model.add_argument("--batch", type=int, help="global batch in sequences per step")
    model.add_argument("--experts", type=int, help="every other block a mixture of E experts")
    model.add_argument("--top-k", type=int, default=2, help="experts per token (default 2)")
    where = parser.add_argument_group("cluster")
    where.add_argument(
        "--cluster", default="dgx-h100", choices=[*CLUSTERS, NAME],
        help="a preset (datasheet numbers), or `here`: this machine's calibration "
        "(`minipar calibrate`), its ranks sharing its cores",
    )  # fmt: skip
    where.add_argument("--gpus", type=int, help="GPUs in all (default: one node)")
    where.add_argument("--nodes", type=int, help="nodes (instead of --gpus)")
    where.add_argument(
        "--fill", default="block", metavar="block|cyclic",
        help="how ranks lie on the nodes: consecutive ranks a node (block, as launchers do; "
        "default) or dealt round, rank r on node r mod nodes (cyclic: `minipar run --fill`)",
    )  # fmt: skip
    where.add_argument("--per-node", type=int, metavar="K",
                       help="GPUs (ranks) a node (default: the cluster's)")  # fmt: skip
    where.add_argument(
        "--link", metavar="RATE",
        help="nodes joined as `minipar run --nodes N --link RATE` joins them: one cable a node "
        "at RATE (2gbit, 200mbit)",
    )  # fmt: skip
    where.add_argument("--gpu-memory", type=float, metavar="GB", help="memory per GPU")
    where.add_argument("--flops", type=float, help="peak FLOP/s per GPU (e.g. a measured one)")
    where.add_argument("--efficiency", type=float, help="fraction of peak reached (default 0.5)")
    where.add_argument(
        "--measure-flops",
        action="store_true",
        help="measure this CPU's FLOP/s (shared by the ranks) as the peak",
    )
    how = parser.add_argument_group("training")
    how.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage")
    how.add_argument("--recompute", nargs="?", const="full", default="none",
                     choices=["none", "selective", "full"],
                     help="activation recomputation (--recompute alone: full)")  # fmt: skip
    how.add_argument("--micro-batch", type=int, action="append", help="only this micro-batch")
    how.add_argument("--cp", type=int, default=1, help="context-parallel degree (default 1)")
    how.add_argument("--cp-variant", default="ring", choices=["ring", "ulysses"])
    how.add_argument("--ep", type=int, default=1, help="expert-parallel degree (divides dp)")
    how.add_argument(
        "--dp-shard",
        type=int,
        default=0,
        metavar="K",
        help="hybrid sharding: ZeRO-3 inside groups of K dp ranks (a node), replicated across "
        "(needs --zero 3; default: shard over all dp)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--top", type=int, default=12, help="feasible rows shown (default 12)")
    out.add_argument("--all", action="store_true", help="also show infeasible layouts")
    out.add_argument("--json", action="store_true", help="print every layout as JSON")


def model_from_args(args) -> ModelSpec:
    overrides = {k: v for k, v in (("seq_len", args.seq), ("global_batch", args.batch)) if v}
    if args.params:
        spec = ModelSpec.from_params(args.params)
    elif args.layers or args.hidden:
        if not (args.layers and args.hidden and args.heads):
            raise ValueError("a model shape needs --layers, --hidden and --heads together")
        spec = ModelSpec(args.layers, args.hidden, args.heads, name="custom")
    else:
        spec = ModelSpec.preset(args.model or "7b")
    if args.vocab:
        overrides["vocab"] = args.vocab
    if args.experts:
        overrides["experts"], overrides["top_k"] = args.experts, args.top_k
    return ModelSpec(**{**asdict(spec), **overrides})


def cluster_from_args(args) -> tuple[Cluster, int]:
    base = here_cluster() if args.cluster == NAME else CLUSTERS[args.cluster]
    cluster = with_peak(
        base,
        args.flops,
        args.gpu_memory * GB if args.gpu_memory else None,
        args.efficiency,
    )
    if args.measure_flops:  # this CPU's rate, shared by the ranks that will run on its cores
        cluster = shared_cores(cluster, args.gpus or 1, launcher.cores(), measure_flops())
    bits = links.parse(args.link) if getattr(args, "link", None) else None
    cluster = on_nodes(cluster, getattr(args, "per_node", None), bits)
    per_node = cluster.hierarchy.per_node
    if args.gpus and args.nodes:
        raise ValueError("give --gpus or --nodes, not both")
    gpus = args.gpus or (args.nodes or 1) * min(per_node, 8)
    if args.cluster == NAME and not args.measure_flops:  # this machine's cores, shared
        cluster = shared_cores(cluster, gpus, launcher.cores())
    return cluster, gpus


def rejected(layouts: list[Layout]):
    """The layouts that do not fit or break a rule, and why."""
    from rich import box
    from rich.table import Table

    t = Table(title="Not feasible", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for col in ("dp", "tp", "pp", "mb x m", "memory", "why not"):
        t.add_column(col, justify="left" if col in ("mb x m", "why not") else "right")
    for lay in layouts:
        if not lay.feasible:
            mb = f"{lay.micro_batch}x{lay.microbatches}"
            cells = (str(lay.dp), str(lay.tp), str(lay.pp), mb, short_bytes(lay.memory["total"]))
            t.add_row(*cells, "; ".join(lay.problems))
    return t


LEGEND = (
    "mb x m: micro-batch size x micro-batches per step; memory per GPU: states (weights, "
    "grads, optimizer), acts (activations); comm: exposed tp + cp + ep + pp + dp communication; "
    "where: each axis's groups inside a node (in) or across N nodes (Nn), priced at that link; "
    "across: bytes one node sends to the others per step"
)


def placement(lay, per_node: int) -> str:
    """Where each axis of a layout runs, its ranks on nodes of per_node GPUs as the layout's fill
    lays them (block: consecutive ranks a node; cyclic: rank r on node r mod nodes; minipar's
    mesh order, tp innermost): "tp inside a node, dp across nodes"."""
    # here, not at the top of the file: the CLI's imports stay light
    from minipar.parallel.mesh import MeshShape

    shape = MeshShape(lay.dp, lay.tp, lay.pp, lay.cp, lay.ep)
    fill = getattr(lay, "fill", "block")
    if fill == "cyclic":
        nodes = max(1, -(-shape.size // per_node))
        where = shape.placement([r % nodes for r in range(shape.size)])
    else:
        where = shape.placement(per_node)
    words = ", ".join(f"{a} {p}" for a, p in where.items()) or "one GPU"
    said = "" if fill == "block" else ", dealt round"
    return f"  where each axis runs ({per_node} GPUs a node{said}): {words}"


def main(args) -> int:
    try:
        model = model_from_args(args)
        cluster, gpus = cluster_from_args(args)
        layouts = plan_layouts(
            model, cluster, gpus, args.zero, args.recompute, args.micro_batch or None,
            cp=args.cp, ep=args.ep, cp_variant=args.cp_variant, dp_shard=args.dp_shard,
            fill=args.fill,
        )  # fmt: skip
    except ValueError as error:
        print(f"minipar plan: {error}", file=sys.stderr)
        return 2
    if args.json:
        rows = [{**asdict(lay), "feasible": lay.feasible} for lay in layouts]
        json.dump({"model": asdict(model), "gpus": gpus, "layouts": rows}, sys.stdout, indent=1)
        print()
        return 0
    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    console = Console(highlight=False)
    console.print(table(layouts, model, cluster, gpus, args.top))
    console.print(LEGEND, style="dim")
    kind = "" if cluster.name == NAME else "preset, "
    console.print(
        f"cluster {cluster.name}: {kind}{cluster.source or 'no source given'}", style="dim"
    )
    if args.all:
        console.print(rejected(layouts))
    chosen = best(layouts)
    if chosen is None:
        console.print("[bold red]No layout fits[/]: try --zero 1..3, --recompute, more GPUs.")
        return 1
    n_bad = sum(not lay.feasible for lay in layouts)
    console.print(placement(chosen, cluster.hierarchy.per_node))
    console.print(
        f"★ best: dp={chosen.dp} tp={chosen.tp} pp={chosen.pp}"
        + (f" cp={chosen.cp}" if chosen.cp > 1 else "")
        + (f" ep={chosen.ep}" if chosen.ep > 1 else "")
        + ", micro-batch "
        f"{chosen.micro_batch} x {chosen.microbatches}; {n_bad} of {len(layouts)} layouts do not "
        f"fit or break a rule{'' if args.all else ' (--all shows them)'}. Estimates, not promises."
    )
    return 0
