"""The planner's layouts as a rich table: memory per GPU, step time, where each group runs
(`where`: "in" inside a node, "2n" across 2 nodes) and the bytes a node sends across per step,
fastest first, the best marked. `minipar plan` prints it, and so does lesson 08; the numbers
are minipar.planning.planner's.

    console.print(plan_table.table(plan_layouts(model, cluster, gpus), model, cluster, gpus, top=6))
"""

from __future__ import annotations

from minipar.planning.planner import GB, Cluster, Layout, ModelSpec, best


def table(layouts: list[Layout], model: ModelSpec, cluster: Cluster, gpus: int, top: int):
    """The feasible layouts, fastest first, the best marked: memory per GPU and step time; on
    more than one node (or with hybrid sharding) also where each group runs and what crosses."""
    from rich import box
    from rich.table import Table

    chosen = best(layouts)
    title = (
        f"{model.name or 'model'}: {short_count(model.params)} params, seq {model.seq_len}, "
        f"batch {model.global_batch}, on {gpus} x {cluster.name} ({cluster.memory / GB:.0f} GB)"
    )
    if layouts and (layouts[0].cp > 1 or layouts[0].ep > 1 or model.experts):
        lay = layouts[0]
        moe = f", top-{model.top_k} of {model.experts} experts" if model.experts else ""
        title += f"; cp={lay.cp} ({lay.cp_variant}), ep={lay.ep}{moe}"
    nodes = gpus > cluster.hierarchy.per_node or any(lay.dp_shard for lay in layouts)
    if layouts and nodes:
        title += f"; data parallel: {DP_MODES[layouts[0].dp_mode]}"
        if layouts[0].dp_shard:
            title += f" (shard over {layouts[0].dp_shard})"
        if layouts[0].fill == "cyclic":
            title += "; ranks dealt round the nodes (--fill cyclic)"
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", padding=0, pad_edge=False)
    columns = [col for col in COLUMNS if nodes or col not in NODE_COLUMNS]
    for col in columns:
        t.add_column(
            col, justify="left" if col in ("", "mb x m", "where") else "right", no_wrap=True
        )
    for lay in [lay for lay in layouts if lay.feasible][:top]:
        row = dict(zip(COLUMNS, _row(lay, model, lay is chosen), strict=True))
        t.add_row(*(row[col] for col in columns))
    return t


COLUMNS = ("", "dp", "tp", "pp", "mb x m", "where", "states", "acts", "total", "compute", "comm",
           "bubble", "step", "across", "tok/s")  # fmt: skip
NODE_COLUMNS = ("where", "across")  # shown only when the layouts span nodes
DP_MODES = {"ddp": "DDP (one gradient all-reduce)", "full": "full sharding (ZeRO-3 over all dp)",
            "hybrid": "hybrid sharding (inside a node, replicated across)"}  # fmt: skip


def where(lay: Layout) -> str:
    """Each axis's groups: "tp in, dp 2n" (inside a node; across 2 nodes); "-" for one GPU."""
    return ", ".join(f"{a} {'in' if n == 1 else f'{n}n'}" for a, n in lay.nodes.items()) or "-"


def _row(lay: Layout, model: ModelSpec, is_best: bool) -> list[str]:
    mem, tm = lay.memory, lay.time
    comm = sum(tm.get(f"{axis}_comm", 0.0) for axis in ("tp", "cp", "ep", "pp", "dp"))
    cells = [
        "★" if is_best else "",
        str(lay.dp),
        str(lay.tp),
        str(lay.pp),
        f"{lay.micro_batch}x{lay.microbatches}",
        where(lay),
        short_bytes(mem["weights"] + mem["grads"] + mem["optimizer"]),
        short_bytes(mem["activations"]),
        short_bytes(mem["total"]),
        short_seconds(tm["compute"]),
        short_seconds(comm),
        short_seconds(tm["bubble"]),
        short_seconds(tm["total"]),
        short_bytes(lay.across_bytes),
        short_count(model.global_batch * model.seq_len / tm["total"]),
    ]
    return [f"[bold green]{c}[/]" if is_best and c else c for c in cells]


def short_bytes(n: float) -> str:
    """Decimal units, as GPU memory is sold: 58.1G, 312M."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def short_seconds(t: float) -> str:
    if t == 0:
        return "0"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g}{unit}"
    return f"{t * 1e9:.3g}ns"


def short_count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"
