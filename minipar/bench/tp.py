"""`minipar bench tp`: forward+backward of the tensor-parallel MLP and attention, minipar against
torch.distributed.tensor.parallel on the same weights, in one MPI job.

    minipar bench tp                 # 2 ranks (TP = 2), the default shapes below
    minipar bench tp -n 4 --iters 30

Every rank builds the same dense twin (DenseMLP, DenseSelfAttention); minipar's layer takes its
slice with `from_dense`; torch's copy is split with ColwiseParallel/RowwiseParallel on a CPU
DeviceMesh over gloo (brought up inside the MPI job). For attention, torch's plan shards qkv's
rows contiguously, so its copy has the rows reordered to [q_r; k_r; v_r] per rank and runs on
its local heads, as torch's tutorial does. Both outputs are checked equal before timing.

One iteration: forward, `sum()` loss, backward, zeroed grads. Iterations start at a barrier and
take the slowest rank's time; the cells take turns (minipar/bench/timing.py). The communication
share is the time of the same collectives alone (two all-reduces of one (b, s, h) activation:
g forward, f backward) over the fwd+bwd time.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys

import minipar
from minipar import launcher
from minipar.bench.timing import Timer

BATCH, SEQ, HIDDEN, FFN, HEADS = 2, 128, 512, 2048, 8


def build(kind: str, mesh, group=None, shape=None):
    """(minipar's module, torch's module, input) for 'mlp' or 'attention', same weights.
    shape: (batch, seq, hidden, ffn, heads), default the bench's."""
    import torch
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    # here, not at the top of the file: torch and numpy load only when used
    from minipar.parallel import tensor as tp

    batch, seq, hidden, ffn, heads = shape or (BATCH, SEQ, HIDDEN, FFN, HEADS)
    torch.manual_seed(0)
    x = torch.randn(batch, seq, hidden)
    if kind == "mlp":
        dense = tp.DenseMLP(hidden, ffn)
        ours = tp.ParallelMLP.from_dense(dense, group)
        plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        return ours, parallelize_module(copy.deepcopy(dense), mesh, plan), x
    dense = tp.DenseSelfAttention(hidden, heads)
    ours = tp.ParallelSelfAttention.from_dense(dense, group)
    theirs = copy.deepcopy(dense)
    p, width = mesh.size(), hidden // mesh.size()
    order = [i * hidden + r * width + j for r in range(p) for i in range(3) for j in range(width)]
    with torch.no_grad():  # rank r's contiguous block of qkv rows = its heads' q, k and v
        theirs.qkv.weight.copy_(dense.qkv.weight[order])
        theirs.qkv.bias.copy_(dense.qkv.bias[order])
    theirs.hidden_size, theirs.num_heads = width, heads // p  # forward sees local tensors
    plan = {"qkv": ColwiseParallel(), "proj": RowwiseParallel()}
    return ours, parallelize_module(theirs, mesh, plan), x


def step(module, x):
    def op():
        module(x).sum().backward()
        module.zero_grad(set_to_none=True)

    return op


def rank_main(out_path: str, iters: int) -> None:
    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.distributed.device_mesh import init_device_mesh

    # here, not at the top of the file: numpy loads only when used
    from minipar.comm.transport.torch import init_from_mpi

    world = minipar.init(backend="mpi")
    init_from_mpi(MPI.COMM_WORLD)
    mesh = init_device_mesh("cpu", (world.size,))
    timer, results = Timer(world, MPI.COMM_WORLD), {}
    act = torch.zeros(BATCH, SEQ, HIDDEN)
    comm_ops = {
        ("comm", "minipar"): lambda: (minipar.all_reduce(act), minipar.all_reduce(act)),
        ("comm", "torch"): lambda: (dist.all_reduce(act), dist.all_reduce(act)),
    }
    for kind in ("mlp", "attention"):
        ours, theirs, x = build(kind, mesh)
        gap = (ours(x) - theirs(x)).abs().max().item()
        assert gap < 1e-4, f"{kind}: minipar and torch disagree by {gap}"
        ops = {(kind, "minipar"): step(ours, x), (kind, "torch"): step(theirs, x)}
        results.update(timer.take_turns(ops, iters, 3, 0.0))
    results.update(timer.take_turns(comm_ops, iters, 3, 0.0))
    if world.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"/".join(k): v for k, v in results.items()}, f)
    dist.barrier()
    minipar.finalize()


def summary(times: dict) -> list[dict]:
    """Rows: block, implementation, min/median/max ms, comm share, ratio to torch."""
    rows = []
    for kind in ("mlp", "attention"):
        torch_median = statistics.median(times[f"{kind}/torch"])
        for impl in ("minipar", "torch"):
            ts, comm = times[f"{kind}/{impl}"], times[f"comm/{impl}"]
            median = statistics.median(ts)
            rows.append(
                {
                    "block": kind,
                    "implementation": impl,
                    "min_ms": 1e3 * min(ts),
                    "median_ms": 1e3 * median,
                    "max_ms": 1e3 * max(ts),
                    "comm_share": statistics.median(comm) / median,
                    "x_torch": median / torch_median,
                }
            )
    return rows


def main(args) -> int:
    """The command side: launch the job, print the table (and --json)."""
    import os
    import tempfile

    from rich.table import Table

    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    console = Console()
    out = os.path.join(tempfile.mkdtemp(prefix="minipar-bench-tp-"), "times.json")
    iters = args.iters or 20
    argv = ["-m", "minipar.bench.tp", out, str(iters)]
    os.environ.setdefault("MINIPAR_TIMEOUT", "120")
    done = launcher.run(args.ranks, argv, timeout=args.timeout, capture=True)
    if not os.path.exists(out):
        console.print(f"[red]minipar bench tp: the job failed[/]\n{(done.stderr or '')[-4000:]}")
        return 1
    with open(out) as f:
        rows = summary(json.load(f))
    table = Table(
        title=f"tensor parallel fwd+bwd, TP={args.ranks}, (b, s, h)=({BATCH}, {SEQ}, {HIDDEN}), "
        f"ffn={FFN}, heads={HEADS}, float32 CPU, {iters} iterations"
    )
    for column in ("block", "impl", "min ms", "median ms", "max ms", "comm share", "x torch"):
        table.add_column(column, justify="left" if column in ("block", "impl") else "right")
    for r in rows:
        table.add_row(
            r["block"],
            r["implementation"],
            *(f"{r[k]:.2f}" for k in ("min_ms", "median_ms", "max_ms")),
            f"{100 * r['comm_share']:.0f}%",
            f"{r['x_torch']:.2f}",
        )
    console.print(table)
    if launcher.cores() < args.ranks:
        console.print("[red]more ranks than cores: these numbers support no claims[/]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    rank_main(sys.argv[1], int(sys.argv[2]))
