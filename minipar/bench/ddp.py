"""`minipar bench ddp`: a data-parallel training step, minipar against torch, and memory per rank.

    minipar bench ddp -n 2 --repeat 5

On an MLP of about 10M parameters (fp32) every rank times forward + backward + gradient sync
for: minipar DDP bucketed (25 MB) and per parameter, torch DDP over gloo (same buckets), the
MPI library's own MPI_Allreduce of the gradients in 25 MB pieces after backward (no overlap),
and the same step without communication (the compute floor). `--nodes 2 -n 4 [--link RATE]`
runs it on emulated nodes (gloo crosses the same link: its ranks find rank 0 by the node's
host name), where minipar's `auto` takes the two-level all-reduce for each bucket. Exposed
communication = step - compute: the part of the all-reduce that backward did not hide. Each
figure is min / median / max over repeats of the slowest rank's step.

Memory: after one AdamW step, the bytes of model state each rank holds (parameters, gradients,
optimizer state, DDP buckets, FSDP's slots; memory that two of them share counted once) for
DDP, DDP + ZeRO-1 and FSDP, against the ZeRO paper's formulas with K = 8 (fp32 Adam moments):
DDP (4+4+K) Psi (the gradients are views of the buckets, as torch's gradient_as_bucket_view);
ZeRO-1 (4+4) Psi + K Psi/N; FSDP (4+4+K) Psi/N + its two slots of the largest unit (fp32), in
the shared window (parallel/data/flat_buffers.py).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import minipar
from minipar.bench import job
from minipar.launcher.cluster import link

WIDTHS = (1024, 2048, 2048, 1024, 1024)  # 9.44M parameters
BATCH = 32
MPI_ROW = "MPI_Allreduce 25 MB, no overlap"  # the MPI library's own, after backward


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


def mpi_sync(model, mpi_comm, cap: int = 25 * 10**6):
    """The reference's gradient sync, after backward (no overlap): every gradient into one flat
    vector, MPI_Allreduce (the MPI library's own) of it in pieces of `cap` bytes (DDP's bucket
    size), divided by the ranks, copied back."""
    import torch
    from mpi4py import MPI

    params = list(model.parameters())
    flat = torch.empty(sum(p.numel() for p in params))
    step = cap // flat.element_size()

    def sync():
        torch.cat([p.grad.reshape(-1) for p in params], out=flat)
        view = flat.numpy()
        for start in range(0, len(view), step):
            mpi_comm.Allreduce(MPI.IN_PLACE, view[start : start + step], op=MPI.SUM)
        flat.div_(mpi_comm.Get_size())
        at = 0
        for p in params:
            p.grad.copy_(flat[at : at + p.numel()].view_as(p.grad))
            at += p.numel()

    return sync


def tensor_bytes(tensors) -> int:
    """Bytes of memory the tensors cover, each byte once (a gradient that is a view of a
    bucket, and the bucket, count once)."""
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
        for t in tensors
        if t is not None and t.numel()
    )
    total, reach = 0, 0
    for start, end in spans:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


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
            extra = list(wrapped.slots.slots)
            formula = 4 * psi / n + tensor_bytes(extra)
        else:
            wrapped = DistributedDataParallel(model)
            cls = torch.optim.AdamW
            if name == "ddp":
                opt = cls(wrapped.parameters(), lr=1e-3)
            else:
                opt = ZeroRedundancyOptimizer(wrapped.parameters(), cls, lr=1e-3)
            extra = [b.buffer for b in wrapped.buckets]  # the gradients are views of them
            formula = 2 * psi + 2 * psi / (n if name == "zero1" else 1)
        wrapped(x).square().mean().backward()
        opt.step()
        inner = opt.optim.state.values() if name == "zero1" and opt.optim else ()
        state = inner if name == "zero1" else opt.state.values()
        held = tensor_bytes(
            list(wrapped.parameters())
            + [p.grad for p in wrapped.parameters()]
            + [v for s in state for v in s.values() if torch.is_tensor(v)]
            + extra
        )
        out[name] = {"measured": held, "formula": formula}
    return out


def ranks(out_path: str, repeat: int, steps: int) -> None:
    import torch
    from mpi4py import MPI

    # here, not at the top of the file: torch and numpy load only when used
    from minipar.comm.transport.torch import init_from_mpi
    from minipar.parallel import DistributedDataParallel

    comm = minipar.init()
    init_from_mpi(MPI.COMM_WORLD)
    load, results = list(os.getloadavg()), {}

    def record(name, times):
        results.setdefault(name, []).append(statistics.median(times))

    for _ in range(repeat):
        record("compute only", timed_steps(build(), steps))
        for cap in (25, 0):
            ddp = DistributedDataParallel(build(), bucket_cap_mb=cap)
            record(f"minipar DDP {'25 MB' if cap else 'per param'}", timed_steps(ddp, steps))
            theirs = torch.nn.parallel.DistributedDataParallel(build(), bucket_cap_mb=cap or 1e-6)
            record(f"torch DDP {'25 MB' if cap else 'per param'}", timed_steps(theirs, steps))
        plain = build()
        record(MPI_ROW, timed_steps(plain, steps, mpi_sync(plain, comm.mpi)))
    mem = memory(comm)
    if comm.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"times": results, "memory": mem, "ranks": comm.size, "load": load,
                       "nodes": minipar.num_nodes()}, f)  # fmt: skip
    torch.distributed.destroy_process_group()
    minipar.finalize()


def run_job(args, module: str, what: str):
    """Launch `python -m module OUT REPEAT STEPS` on args.ranks ranks (on args.nodes emulated
    nodes joined at args.link, when given); its JSON, or None (the failure printed)."""
    repeat = max(1, args.repeat if args.repeat > 1 else 3)
    nodes, rate = getattr(args, "nodes", None), getattr(args, "link", None)
    return job.run_json(args.ranks, module, [repeat, 5], args.timeout, what, nodes, rate)


def show_times(console, data: dict, title: str) -> None:
    """The step table: min / median / max over repeats of each repeat's median step, exposed
    communication (step - compute only), and minipar's step over torch's (`minipar X` against
    `torch X`) in each repeat: min / median / max of those ratios."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("step (ms)", "min", "median", "max", "exposed comm (median)",
                "vs torch: min / median / max"):  # fmt: skip
        table.add_column(col, justify="right" if col != "step (ms)" else "left")
    times = data["times"]
    floor = statistics.median(times["compute only"])
    for name, values in times.items():
        med = statistics.median(values)
        other = times.get(name.replace("minipar", "torch"))
        ratio = ""
        if name.startswith("minipar") and other:
            ratios = [a / b for a, b in zip(values, other)]
            ratio = " / ".join(f"{r:.2f}x" for r in (min(ratios), statistics.median(ratios),
                                                      max(ratios)))  # fmt: skip
        exposed = f"{1e3 * (med - floor):.1f}" if name != "compute only" else ""
        row = [f"{1e3 * min(values):.1f}", f"{1e3 * med:.1f}", f"{1e3 * max(values):.1f}"]
        table.add_row(name, *row, exposed, ratio)
    console.print(table)


def show_memory(console, data: dict) -> None:
    from rich.table import Table

    mem = Table(title="model-state bytes per rank after one AdamW step (MiB)")
    for col in ("strategy", "measured", "formula"):
        mem.add_column(col, justify="right" if col != "strategy" else "left")
    for name, m in data["memory"].items():
        formula = "" if m.get("formula") is None else f"{m['formula'] / 2**20:.1f}"
        mem.add_row(name, f"{m['measured'] / 2**20:.1f}", formula)
    console.print(mem)


def main(args) -> int:
    return report(args, "minipar.bench.ddp", "ddp", "data-parallel step")


def report(args, module: str, kind: str, what: str) -> int:
    """Run `module`'s job (bench ddp's or bench fsdp's), print its step times and memory under
    a title starting with `what`, and write --json; the exit status."""
    from rich.console import Console

    console = Console()
    console.width = max(console.width, 110)
    if getattr(args, "link", None) and not getattr(args, "nodes", None):
        console.print("[red]minipar bench: --link shapes emulated nodes: give --nodes N too[/]")
        return 2
    data = run_job(args, module, kind)
    if data is None:
        return 1
    load = data.get("load")
    title = f"{what}, {data['ranks']} ranks, 9.44M-param MLP"
    if getattr(args, "nodes", None):
        data["link"] = args.link or link.DEFAULT
        title += f", {data.get('nodes')} emulated nodes joined at {data['link']}"
    show_times(console, data, title + (f" (load {load[0]:.1f} at the start)" if load else ""))
    show_memory(console, data)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    return 0


if __name__ == "__main__":
    ranks(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
