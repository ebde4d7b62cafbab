"""Faults inside the parallel strategies: rank 1 raises (or exits) in the middle of a training
step of DDP, FSDP, tensor parallelism or a pipeline, while its peers are inside the strategy's
collectives or waiting for its activations. The job must end non-zero within seconds with rank
1's traceback, on both transports.

    MINIPAR_TIMEOUT=3 mpiexec -n 2 python tests/faults/strategies.py ddp        # MPI transport
    MINIPAR_TIMEOUT=3 python tests/faults/strategies.py pp --torch 2           # torch (gloo)

Strategies: ddp (in a gradient hook, with a bucket in flight), fsdp (inside a unit's forward,
after its all-gather), tp (between the column and the row layer), pp (in stage 1's forward of
micro-batch 2, while stage 0 sends). Add --exit for sys.exit(3) instead of an exception.
"""

from __future__ import annotations

import argparse
import sys
import time

FAULTY = 1
STRATEGIES = ["ddp", "fsdp", "tp", "pp"]


def misbehave(what: str, exit_instead: bool) -> None:
    print(f"[fault] rank {FAULTY} {what} at {time.time():.3f}", file=sys.stderr, flush=True)
    if exit_instead:
        sys.exit(3)
    raise RuntimeError(f"injected fault ({what})")


class Trap:
    """Calls misbehave() on rank FAULTY the `when`-th time it is called."""

    def __init__(self, rank: int, what: str, when: int, exit_instead: bool):
        self.rank, self.what, self.when, self.exit_instead, self.count = (
            rank,
            what,
            when,
            exit_instead,
            0,
        )

    def __call__(self, *_):
        self.count += 1
        if self.rank == FAULTY and self.count == self.when:
            misbehave(self.what, self.exit_instead)


def mlp():
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = [nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)]
    return nn.Sequential(*layers)


def step_ddp(rank: int, trap: Trap) -> None:
    import torch

    from minipar.parallel import DistributedDataParallel

    model = DistributedDataParallel(mlp(), bucket_cap_mb=0)  # a bucket per parameter
    model.module[2].weight.register_hook(lambda g: trap())  # mid-backward: buckets in flight
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
        model.finish_gradient_synchronization()


def step_fsdp(rank: int, trap: Trap) -> None:
    import torch
    from torch import nn

    from minipar.parallel import FullyShardedDataParallel

    model = FullyShardedDataParallel(mlp(), shard_modules=(nn.Linear,))
    model.module[2].register_forward_pre_hook(lambda *_: trap())
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
        model.finish_gradient_synchronization()


def step_tp(rank: int, trap: Trap) -> None:
    import torch

    from minipar.parallel.tensor import ColumnParallelLinear, RowParallelLinear

    torch.manual_seed(0)
    column, row = ColumnParallelLinear(8, 16), RowParallelLinear(16, 8)
    for _ in range(2):
        hidden = column(torch.randn(4, 8))
        trap()
        row(hidden).sum().backward()


def step_pp(rank: int, trap: Trap) -> None:
    import torch

    from minipar.parallel.pipeline import Pipeline, split

    stages = split(mlp(), 2)
    stages[rank].register_forward_pre_hook(lambda *_: trap())
    pipe = Pipeline(stages[rank], n_microbatches=4, loss_fn=torch.nn.functional.mse_loss)
    for _ in range(2):
        pipe.step(torch.randn(8, 8), torch.randn(8, 4))


STEPS = {"ddp": step_ddp, "fsdp": step_fsdp, "tp": step_tp, "pp": step_pp}
WHEN = {"ddp": 1, "fsdp": 2, "tp": 2, "pp": 2}  # which call of the trap misbehaves


def main(strategy: str, exit_instead: bool) -> None:
    import minipar

    world = minipar.init()
    trap = Trap(world.rank, strategy, WHEN[strategy], exit_instead)
    STEPS[strategy](world.rank, trap)
    minipar.barrier()
    print(f"rank {world.rank}: finished", flush=True)
    minipar.finalize()


def _spawned(rank: int, strategy: str, exit_instead: bool) -> None:
    main(strategy, exit_instead)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("strategy", choices=STRATEGIES)
    parser.add_argument("--torch", type=int, metavar="N", help="spawn N ranks over gloo")
    parser.add_argument("--exit", action="store_true", help="sys.exit(3) instead of raising")
    args = parser.parse_args()
    if args.torch is None:
        main(args.strategy, args.exit)
    else:
        import minipar.parallel  # noqa: F401  (once, here: the ranks are forked with it loaded)
        from minipar.testing import spawn

        spawn.spawn(_spawned, (args.strategy, args.exit), args.torch, fork=True)
