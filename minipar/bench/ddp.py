"""`minipar bench ddp`: a data-parallel training step, minipar against torch, and memory per rank.

    minipar bench ddp -n 2 --repeat 5

On an MLP of about 10M parameters (fp32) every rank times forward + backward + gradient sync
for: minipar DDP bucketed (25 MB) and per parameter, torch DDP over gloo (same buckets), and the
same step without communication (the compute floor). Exposed communication = step - compute:
the part of the all-reduce that backward did not hide. Each figure is min / median / max over
repeats of the slowest rank's step.

Memory: after one AdamW step, the bytes of model state each rank holds (parameters, gradients,
optimizer state, DDP buckets; FSDP's largest gathered unit at its peak) for DDP, DDP + ZeRO-1
and FSDP, against the ZeRO paper's formulas with K = 8 (fp32 Adam moments): DDP (4+4+K) Psi
plus buckets 4 Psi; ZeRO-1 (4+4) Psi + K Psi/N + buckets; FSDP (4+4+K) Psi/N + a full unit.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import minipar
from minipar import launch

WIDTHS = (1024, 2048, 2048, 1024, 1024)  # 9.44M parameters
BATCH = 32


def build():
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = []
    for a, b in zip(WIDTHS[:-1], WIDTHS[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def timed_steps(model, steps: int, sync=None) -> list[float]:
    """Seconds per step of the slowest rank (a barrier starts each step)."""
    import torch

    x = torch.randn(BATCH, WIDTHS[0])
    times = []
    for _ in range(steps + 1):
        for p in model.parameters():
            p.grad = None
        minipar.barrier()
        start = time.perf_counter()
        model(x).square().mean().backward()
        if sync is not None:
            sync()
        mine = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        minipar.all_reduce(mine, minipar.ReduceOp.MAX)
        times.append(float(mine))
    return times[1:]  # the first step allocates buckets and warms caches


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def memory(comm) -> dict:
    """Bytes of model state on this rank after one AdamW step, per strategy, and the formula."""
    import torch

    # here, not at the top of the file: torch and numpy load only when used
    from minipar.parallel import (
        DistributedDataParallel,
        FullyShardedDataParallel,
        ZeroRedundancyOptimizer,
    )

    n, x = comm.size, torch.randn(BATCH, WIDTHS[0])
    out = {}
    for name in ("ddp", "zero1", "fsdp"):
        model = build()
        psi = 4 * sum(p.numel() for p in model.parameters())
        if name == "fsdp":
            wrapped = FullyShardedDataParallel(model)
            opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
            extra = max(4 * u.block * n for u in wrapped.units)  # one unit gathered at a time
            formula = 4 * psi / n + extra
        else:
            wrapped = DistributedDataParallel(model)
            cls = torch.optim.AdamW
            if name == "ddp":
                opt = cls(wrapped.parameters(), lr=1e-3)
            else:
                opt = ZeroRedundancyOptimizer(wrapped.parameters(), cls, lr=1e-3)
            extra = tensor_bytes(b.buffer for b in wrapped.buckets)
            formula = (2 * psi + 2 * psi / (n if name == "zero1" else 1)) + psi
        wrapped(x).square().mean().backward()
        opt.step()
        inner = opt.optim.state.values() if name == "zero1" and opt.optim else ()
        state = inner if name == "zero1" else opt.state.values()
        held = (
            tensor_bytes(wrapped.parameters())
            + tensor_bytes(p.grad for p in wrapped.parameters())
            + tensor_bytes(v for s in state for v in s.values() if torch.is_tensor(v))
            + extra
        )
        out[name] = {"measured": held, "formula": formula}
    return out


def ranks(out_path: str, repeat: int, steps: int) -> None:
    import torch
    from mpi4py import MPI

    # here, not at the top of the file: torch and numpy load only when used
    from minipar.comm.torch import init_from_mpi
    from minipar.parallel import DistributedDataParallel

    comm = minipar.init()
    init_from_mpi(MPI.COMM_WORLD)
    results: dict = {}

    def record(name, times):
        results.setdefault(name, []).append(statistics.median(times))

    for _ in range(repeat):
        record("compute only", timed_steps(build(), steps))
        for cap in (25, 0):
            ddp = DistributedDataParallel(build(), bucket_cap_mb=cap)
            record(f"minipar DDP {'25 MB' if cap else 'per param'}", timed_steps(ddp, steps))
            theirs = torch.nn.parallel.DistributedDataParallel(build(), bucket_cap_mb=cap or 1e-6)
            record(f"torch DDP {'25 MB' if cap else 'per param'}", timed_steps(theirs, steps))
    mem = memory(comm)
    if comm.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"times": results, "memory": mem, "ranks": comm.size}, f)
    torch.distributed.destroy_process_group()
    minipar.finalize()


def main(args) -> int:
    import tempfile

    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.width = max(console.width, 110)
    out = tempfile.mktemp(suffix=".json", prefix="minipar-bench-ddp-")
    repeat = max(1, args.repeat if args.repeat > 1 else 3)
    argv = ["-m", "minipar.bench.ddp", out, str(repeat), "5"]
    done = launch.run(args.ranks, argv, timeout=args.timeout, capture=True)
    if done.returncode != 0:
        console.print(f"[red]minipar bench ddp failed:[/]\n{(done.stderr or '')[-3000:]}")
        return 1
    with open(out) as f:
        data = json.load(f)
    table = Table(title=f"data-parallel step, {data['ranks']} ranks, 9.44M-param MLP (ms)")
    for col in ("step", "min", "median", "max", "exposed comm (median)", "vs torch (median)"):
        table.add_column(col, justify="right" if col != "step" else "left")
    times = data["times"]
    floor = statistics.median(times["compute only"])
    for name, values in times.items():
        med = statistics.median(values)
        other = name.replace("minipar", "torch")
        ratio = (
            f"{med / statistics.median(times[other]):.2f}x" if name.startswith("minipar") else ""
        )
        exposed = f"{1e3 * (med - floor):.1f}" if name != "compute only" else ""
        row = [f"{1e3 * min(values):.1f}", f"{1e3 * med:.1f}", f"{1e3 * max(values):.1f}"]
        table.add_row(name, *row, exposed, ratio)
    console.print(table)
    mem = Table(title="model-state bytes per rank after one AdamW step (MiB)")
    for col in ("strategy", "measured", "formula"):
        mem.add_column(col, justify="right" if col != "strategy" else "left")
    for name, m in data["memory"].items():
        mem.add_row(name, f"{m['measured'] / 2**20:.1f}", f"{m['formula'] / 2**20:.1f}")
    console.print(mem)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    return 0


if __name__ == "__main__":
    ranks(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
