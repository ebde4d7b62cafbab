"""`minipar bench moe`: forward+backward of the expert-parallel MoE layer at ep = the job's
ranks, against the same layer with every expert local, and the all-to-alls' share of the step.

    minipar bench moe                               # ep = 2 ranks
    minipar bench moe -n 4 --iters 30 --json moe.json
    python -m minipar.bench.moe OUT.json ITERS      # the rank side, under mpiexec

Every rank builds the same DenseMoE (E experts, top-2, dropless) and its own tokens; the
expert-parallel layer takes its experts with `MoE.from_dense` and routes every rank's tokens to
their experts' ranks (a count all-gather and two all-to-alls forward, two backward); the local
layer is the dense twin run on the same tokens with all E experts on the rank, no message. With
an even router both do about k T expert rows per rank, so the difference is the exchange and
its bookkeeping. The communication row times the exchange alone: the count all-gather and the
four all-to-alls with the split sizes of the routing seen. Timing as in minipar/bench/timing.py
(iterations start at a barrier and take the slowest rank's time; the cells take turns).
"""

from __future__ import annotations

import json
import statistics
import sys

import minipar
from minipar import launcher
from minipar.bench import job
from minipar.bench.timing import Timer

TOKENS, HIDDEN, FFN, EXPERTS, TOP_K = 256, 512, 2048, 8, 2


def build(seed: int = 0, shape=None):
    """(expert-parallel MoE, its dense twin, this rank's tokens (T, hidden))."""
    import torch

    # here, not at the top of the file: torch and numpy load only when used
    from minipar.parallel.expert import DenseMoE, MoE

    tokens, hidden, ffn, experts, top_k = shape or (TOKENS, HIDDEN, FFN, EXPERTS, TOP_K)
    torch.manual_seed(seed)
    dense = DenseMoE(hidden, ffn, experts, top_k)
    gen = torch.Generator().manual_seed(seed + 1 + minipar.get_rank())
    return MoE.from_dense(dense), dense, torch.randn(tokens, hidden, generator=gen)


def step(module, x):
    def op():
        module(x).sum().backward()
        module.zero_grad(set_to_none=True)

    return op


def exchange_only(moe, x):
    """The layer's communication alone, with the routing of x: the count all-gather, then
    dispatch and combine forward and the same two reversed backward."""
    # here, not at the top of the file: torch and numpy load only when used
    from minipar.parallel.expert import dispatch, exchange

    routing = moe.router(x.detach())
    plan = dispatch.plan(routing.experts, routing.kept, moe.n_experts, moe.ep)
    header = exchange.header(x)
    rows = exchange.exchange_counts(header, routing.fitted[0], routing.routed[0], moe.group)
    width = len(exchange.HEADER)
    received = rows[:, width + moe.first : width + moe.first + moe.n_local].sum(1).tolist()
    ours = [x.new_zeros(plan.kept, x.shape[1]) for _ in range(2)]  # sent, and back
    theirs = [x.new_zeros(sum(received), x.shape[1]) for _ in range(2)]

    def a2a(out, inp, out_splits, in_splits):
        minipar.all_to_all_single(
            out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits
        )

    def op():
        exchange.exchange_counts(header, routing.fitted[0], routing.routed[0], moe.group)
        for _ in range(2):  # forward, then backward: dispatch's direction, then combine's
            a2a(theirs[0], ours[0], received, plan.splits)
            a2a(ours[1], theirs[1], plan.splits, received)

    return op


def rank_main(out_path: str, iters: int) -> None:
    from mpi4py import MPI

    world = minipar.init(backend="mpi")
    moe, dense, x = build()
    ep_x = x.clone().requires_grad_()
    ops = {
        ("moe", "ep"): step(moe, ep_x),
        ("moe", "local"): step(dense, x.clone().requires_grad_()),
        ("comm", "ep"): exchange_only(moe, x),
    }
    with minipar.trace() as t:
        ops["moe", "ep"]()
    results = Timer(world, MPI.COMM_WORLD).take_turns(ops, iters, 3, 0.0)
    results = {"/".join(k): v for k, v in results.items()}
    results["bytes/ep"] = [float(t.bytes_sent("all_to_all"))]
    results["imbalance/ep"] = [moe.last_stats.imbalance]
    if world.rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    world.barrier()
    minipar.finalize()


def summary(times: dict) -> list[dict]:
    """Rows: layout, min/median/max ms, the exchange's share of the step, ratio to local."""
    local = statistics.median(times["moe/local"])
    rows = []
    for layout in ("ep", "local"):
        ts = times[f"moe/{layout}"]
        median = statistics.median(ts)
        comm = statistics.median(times["comm/ep"]) / median if layout == "ep" else 0.0
        rows.append(
            {
                "layout": layout,
                "min_ms": 1e3 * min(ts),
                "median_ms": 1e3 * median,
                "max_ms": 1e3 * max(ts),
                "comm_share": comm,
                "x_local": median / local,
            }
        )
    return rows


def main(args) -> int:
    """The command side (for minipar/cli/bench.py): launch the job, print the table."""
    import os

    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    console = Console()
    iters = args.iters or 20
    os.environ.setdefault("MINIPAR_TIMEOUT", "120")
    times = job.run_json(args.ranks, "minipar.bench.moe", [iters], args.timeout, "moe")
    if times is None:
        return 1
    show(console, times, iters, args.ranks, args.json)
    return 0


def show(console, times: dict, iters: int, ranks: int, json_path=None) -> dict:
    """Print the table of a finished job's times (and write the record to json_path)."""
    from rich.table import Table

    table = Table(
        title=f"MoE fwd+bwd, ep={ranks}, T={TOKENS} tokens/rank, hidden={HIDDEN}, "
        f"ffn={FFN}, E={EXPERTS}, top-{TOP_K}, dropless, float32 CPU, {iters} iterations"
    )
    for column in ("layout", "min ms", "median ms", "max ms", "all-to-all share", "x local"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    for r in summary(times):
        share = f"{100 * r['comm_share']:.0f}%" if r["layout"] == "ep" else "-"
        table.add_row(
            r["layout"], *(f"{r[k]:.2f}" for k in ("min_ms", "median_ms", "max_ms")), share,
            f"{r['x_local']:.2f}",
        )  # fmt: skip
    console.print(table)
    console.print(
        f"all-to-all bytes sent by rank 0 per step: {int(times['bytes/ep'][0]):,} "
        f"(imbalance {times['imbalance/ep'][0]:.2f})"
    )
    if launcher.cores() < ranks:
        console.print("[red]more ranks than cores: these numbers support no claims[/]")
    record = {"rows": summary(times), "all_to_all_bytes_rank0": int(times["bytes/ep"][0]),
              "imbalance": times["imbalance/ep"][0]}  # fmt: skip
    if json_path:
        with open(json_path, "w") as f:
            json.dump(record, f, indent=1)
        console.print(f"wrote {json_path}")
    return record


if __name__ == "__main__":
    rank_main(sys.argv[1], int(sys.argv[2]))
