"""`minipar bench fsdp`: a fully sharded training step, minipar's FSDP against torch's FSDP2.

    minipar bench fsdp -n 2 --repeat 3
    minipar bench fsdp -n 4 --json fsdp.json

The model and batch of `bench ddp` (bench/ddp.py: a 9.44M-parameter fp32 MLP, batch 32 per
rank), every Linear a sharding unit on both sides: minipar's FullyShardedDataParallel (each
module with parameters is a unit) and torch's FSDP2 (`torch.distributed.fsdp.fully_shard` on
each Linear and on the root, over gloo on a CPU DeviceMesh brought up in the same job; it
reshards after forward, as minipar does). One step is forward + backward + the gradients'
reduce-scatter, the slowest rank's time; "compute only" is the plain model. Each repeat takes the
median of 5 steps; the table shows min / median / max over repeats, and minipar's step over
torch's in each repeat.

Memory per rank after one AdamW step, counted from the live tensors: parameters, gradients and
optimizer state (torch's: the local shards of its DTensors), plus what each keeps between steps
for communication (minipar's slots, parallel/data/flat_buffers.py; torch's all-gather buffers
are freed after each unit, and on the CPU torch keeps no allocator statistics to show their
peak). Formula: (4+4+K) Psi/N with K = 8, plus minipar's slots. `--json` writes
{"times": {row: [median per repeat]}, "memory": {row: {measured, formula}}, "ranks", "load"},
the shape of `bench ddp`'s.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import minipar
from minipar.bench import ddp


def minipar_fsdp():
    # here, not at the top of the file: torch and numpy load only when used
    from minipar.parallel import FullyShardedDataParallel

    return FullyShardedDataParallel(ddp.build())


def torch_fsdp(mesh):
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    model = ddp.build()
    for module in model:
        if isinstance(module, nn.Linear):
            fully_shard(module, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def local(t):
    """A DTensor's local shard (torch FSDP2's parameters and gradients), or the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def memory(comm, mesh) -> dict:
    """Bytes of model state on this rank after one AdamW step, and the formula."""
    import torch

    x, n, out = torch.randn(ddp.BATCH, ddp.WIDTHS[0]), comm.size, {}
    psi = 4 * sum(p.numel() for p in ddp.build().parameters())
    for name, make in (("minipar FSDP", minipar_fsdp), ("torch FSDP", lambda: torch_fsdp(mesh))):
        model = make()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(x).square().mean().backward()
        opt.step()
        slots = []
        if name.startswith("minipar"):
            slots = list(model.slots.slots)
        state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
        held = ddp.tensor_bytes(
            [local(p) for p in model.parameters()]
            + [local(p.grad) for p in model.parameters() if p.grad is not None]
            + [local(v) for v in state]
            + slots
        )
        out[name] = {"measured": held, "formula": 4 * psi / n + ddp.tensor_bytes(slots)}
    return out


def ranks(out_path: str, repeat: int, steps: int) -> None:
    import torch
    from mpi4py import MPI
    from torch.distributed.device_mesh import init_device_mesh

    # here, not at the top of the file: torch and numpy load only when used
    from minipar.comm.transport.torch import init_from_mpi

    comm = minipar.init()
    init_from_mpi(MPI.COMM_WORLD)
    mesh = init_device_mesh("cpu", (comm.size,))
    load, results = list(os.getloadavg()), {}

    def record(name, times):
        results.setdefault(name, []).append(statistics.median(times))

    for _ in range(repeat):
        record("compute only", ddp.timed_steps(ddp.build(), steps))
        record("minipar FSDP", ddp.timed_steps(minipar_fsdp(), steps))
        record("torch FSDP", ddp.timed_steps(torch_fsdp(mesh), steps))
    mem = memory(comm, mesh)
    if comm.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"times": results, "memory": mem, "ranks": comm.size, "load": load,
                       "nodes": minipar.num_nodes()}, f)  # fmt: skip
    torch.distributed.destroy_process_group()
    minipar.finalize()


def main(args) -> int:
    what = "fully sharded step (torch FSDP = FSDP2: fully_shard, gloo)"
    return ddp.report(args, "minipar.bench.fsdp", "fsdp", what)


if __name__ == "__main__":
    ranks(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
