"""Context-parallel attention timed: ring and Ulysses on cp ranks against dense attention on one
rank at the same total sequence, forward + backward, with the communication each hid.

    minipar bench cp                 # cp = 2 ranks, the default shapes below
    minipar bench cp -n 4 --iters 30 --json cp.json
    python -m minipar.bench.context OUT.json ITERS [SEQ]    # the rank side, under mpiexec

Cells, each one forward, a `(out * dy).sum()` backward, iterations between barriers taking the
slowest rank's time (minipar/bench/timing.py, the cells taking turns):
    dense     torch's scaled_dot_product_attention on the full (batch, heads, SEQ, head_dim) on
              every rank, as if one GPU held the whole sequence
    ring      ring_attention on this rank's SEQ/cp tokens (load-balanced causal layout)
    ulysses   ulysses_attention on the same shards
    ring-comm, ulysses-comm   the same messages with no compute: the ring's cp - 1 K/V steps
              forward, cp - 1 K/V and cp - 1 dK/dV steps backward; Ulysses' 8 all-to-alls
The communication a variant hid is comm alone minus the time it spent waiting (ContextStats'
wait_seconds, per iteration): hidden = 1 - wait / comm, floored at 0. Waiting also covers a
slower neighbour's lag (a rank waits for a block its neighbour has not sent yet), so a loaded
machine shows more waiting than the messages alone take. Ulysses' all-to-alls block: it hides
nothing by construction; the ring hides what the block products cover. On a shared CPU the ranks
compete for cores: with more ranks than cores these figures support no claims.
"""

from __future__ import annotations

import json
import statistics
import sys

import minipar
from minipar import launcher
from minipar.bench import job
from minipar.bench.timing import Timer

BATCH, HEADS, SEQ, HEAD_DIM = 1, 8, 1024, 64


def inputs(seq: int):
    """The same full q, k, v and upstream gradient on every rank."""
    import torch

    g = torch.Generator().manual_seed(0)
    return [torch.randn(BATCH, HEADS, seq, HEAD_DIM, generator=g) for _ in range(4)]


def attention_step(fn, tensors, **kw):
    """One forward + backward of fn on copies of q, k, v that require grad; op.calls counts
    them (warm-up included)."""

    def op():
        q, k, v, dy = tensors
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        (fn(q, k, v, **kw) * dy).sum().backward()
        op.calls += 1

    op.calls = 0
    return op


def ring_traffic(kv, group):
    """The ring's messages alone: cp - 1 K/V steps (forward), then cp - 1 steps of K/V and dK/dV
    side by side (backward), each the send right and the receive from the left."""
    import torch

    # here, not at the top of the file: torch and numpy load only when used
    from minipar.parallel.context import ring

    incoming = [torch.empty_like(kv), torch.empty_like(kv)]

    def op():
        for blocks in ([kv], [kv, kv]):  # forward; backward (dK/dV of the same size)
            for _ in range(minipar.get_world_size(group) - 1):
                works = []
                for tag, block, into in zip((ring.KV_TAG, ring.DKV_TAG), blocks, incoming):
                    works += ring.pass_on(block, into, group, tag)
                for work in works:
                    work.wait()

    return op


def ulysses_traffic(shard, group):
    """Ulysses' messages alone: 8 all-to-alls of one shard (4 forward, 4 backward)."""
    import torch

    out = torch.empty_like(shard)

    def op():
        for _ in range(8):
            minipar.all_to_all_single(out, shard, group=group)

    return op


def rank_main(out_path: str, iters: int, seq: int = SEQ) -> None:
    import torch
    from mpi4py import MPI
    from torch.nn import functional as F

    # here, not at the top of the file: torch and numpy load only when used
    from minipar.parallel.context import (
        ContextStats,
        ring_attention,
        shard_sequence,
        ulysses_attention,
    )

    world = minipar.init(backend="mpi")
    timer = Timer(world, MPI.COMM_WORLD)
    full = inputs(seq)
    shards = [shard_sequence(t, 2, causal=True) for t in full]
    stats = {"ring": ContextStats(), "ulysses": ContextStats()}
    kv = torch.stack(shards[1:3])
    ops = {
        "dense": attention_step(F.scaled_dot_product_attention, full, is_causal=True),
        "ring": attention_step(ring_attention, shards, causal=True, stats=stats["ring"]),
        "ulysses": attention_step(ulysses_attention, shards, causal=True, stats=stats["ulysses"]),
        "ring-comm": ring_traffic(kv, None),
        "ulysses-comm": ulysses_traffic(shards[0], None),
    }
    times = timer.take_turns(ops, iters, 2, 0.0)
    waits = {name: s.wait_seconds / ops[name].calls for name, s in stats.items()}
    waits = {name: timer.max_over_ranks(w) for name, w in waits.items()}
    if world.rank == 0:
        with open(out_path, "w") as f:
            shape = {"batch": BATCH, "heads": HEADS, "seq": seq, "head_dim": HEAD_DIM}
            json.dump({"times": times, "waits": waits, "cp": world.size, "shape": shape}, f)
    minipar.finalize()


def summary(result: dict) -> list[dict]:
    """Rows: cell, min / median / max ms, x dense (median over dense's median), and for ring and
    Ulysses the communication alone, the time waited and the share of it hidden."""
    times, waits = result["times"], result["waits"]
    dense = statistics.median(times["dense"])
    rows = []
    for cell in ("dense", "ring", "ulysses"):
        ts = times[cell]
        row = {
            "cell": cell,
            "min_ms": 1e3 * min(ts),
            "median_ms": 1e3 * statistics.median(ts),
            "max_ms": 1e3 * max(ts),
            "x_dense": statistics.median(ts) / dense,
        }
        if cell != "dense":
            comm = statistics.median(times[f"{cell}-comm"])
            row["comm_ms"], row["waited_ms"] = 1e3 * comm, 1e3 * waits[cell]
            row["hidden"] = max(0.0, 1.0 - waits[cell] / comm) if comm > 0 else 0.0
        rows.append(row)
    return rows


def main(args) -> int:
    """The command side (for minipar/cli/bench.py): launch the job, print the table (and
    --json: the rows)."""
    import os

    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    console = Console()
    iters = args.iters or 20
    os.environ.setdefault("MINIPAR_TIMEOUT", "120")
    result = job.run_json(args.ranks, "minipar.bench.context", [iters], args.timeout, "cp")
    if result is None:
        return 1
    show(console, result, iters, args.ranks, args.json)
    return 0


def show(console, result: dict, iters: int, ranks: int, json_path=None) -> list[dict]:
    """Print the table of a finished job's result (and write its rows to json_path)."""
    from rich.table import Table

    rows = summary(result)
    shape = result["shape"]
    table = Table(
        title=f"causal attention fwd+bwd, cp={result['cp']}, (batch, heads, seq, head_dim)="
        f"({shape['batch']}, {shape['heads']}, {shape['seq']}, {shape['head_dim']}), float32 "
        f"CPU, {iters} iterations; dense: the whole sequence on one rank"
    )
    for column in ("cell", "min ms", "median ms", "max ms", "x dense", "comm alone ms",
                   "waited ms", "hidden"):  # fmt: skip
        table.add_column(column, justify="left" if column == "cell" else "right")
    for r in rows:
        comm = [f"{r[k]:.2f}" for k in ("comm_ms", "waited_ms")] if "comm_ms" in r else ["-"] * 2
        hidden = f"{100 * r['hidden']:.0f}%" if "hidden" in r else "-"
        table.add_row(
            r["cell"], *(f"{r[k]:.2f}" for k in ("min_ms", "median_ms", "max_ms")),
            f"{r['x_dense']:.2f}", *comm, hidden,
        )  # fmt: skip
    console.print(table)
    if launcher.cores() < ranks:
        console.print("[red]more ranks than cores: these numbers support no claims[/]")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
        console.print(f"wrote {json_path}")
    return rows


if __name__ == "__main__":
    rank_main(sys.argv[1], int(sys.argv[2]), *(int(a) for a in sys.argv[3:4]))
