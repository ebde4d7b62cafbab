"""Which device each rank computes on: its local rank (its index among the ranks on its node)
modulo the CUDA devices it can see, or the CPU where there is none.

    minipar.init()
    x = torch.ones(8, device=minipar.device())   # cuda:<local rank % GPUs>, or cpu

The local rank comes from the launcher's environment, read in this order (the first one set
wins, so an MPI launcher started inside a Slurm or torchrun job is believed over the outer one):

| launcher                      | variable                    |
| ----------------------------- | --------------------------- |
| Open MPI's mpirun / prterun   | OMPI_COMM_WORLD_LOCAL_RANK  |
| MPICH's Hydra mpiexec, Intel  | MPI_LOCALRANKID             |
| MVAPICH's mpirun_rsh          | MV2_COMM_WORLD_LOCAL_RANK   |
| torchrun                      | LOCAL_RANK                  |
| Slurm's srun                  | SLURM_LOCALID               |

With none of them set (a launcher we do not know), the node map init() found (runtime/nodes.py:
under MPI, a shared-memory split of the world, MPI_COMM_TYPE_SHARED) gives the local rank: this
rank's index among its node's ranks. Several ranks on
one GPU (more local ranks than devices) is allowed: they take turns on it, and `minipar doctor`
says so. torch is imported only when a device is asked for, or when the caller has imported it.
"""

from __future__ import annotations

import os
import sys

from minipar.errors import NotInitializedError
from minipar.runtime import nodes
from minipar.state import process

LOCAL_RANK_ENV = (
    ("OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"),
    ("MPI_LOCALRANKID", "MPICH Hydra"),
    ("MV2_COMM_WORLD_LOCAL_RANK", "MVAPICH"),
    ("LOCAL_RANK", "torchrun"),
    ("SLURM_LOCALID", "Slurm"),
)


def local_rank_from_env(env) -> tuple[int, str] | None:
    """(local rank, which launcher's variable said so) from an environment mapping, or None.

    A value that is not a non-negative integer is an error naming the variable: a wrong device
    would be chosen silently otherwise."""
    for name, launcher in LOCAL_RANK_ENV:
        value = env.get(name)
        if value is None or value == "":
            continue
        try:
            rank = int(value)
        except ValueError:
            rank = -1
        if rank < 0:
            raise ValueError(
                f"{name}={value!r} ({launcher}'s local rank) is not a non-negative integer"
            )
        return rank, f"{name} ({launcher})"
    return None


def pick_index(local_rank: int, count: int) -> int | None:
    """The CUDA device index for a local rank among `count` visible devices (None: the CPU)."""
    if count <= 0:
        return None
    return local_rank % count


def ranks_per_device(local_size: int, count: int) -> int:
    """How many ranks share the busiest device when `local_size` ranks share `count` GPUs."""
    if count <= 0:
        return 0
    return -(-local_size // count)


def remember(comm) -> None:
    """Called by init(): find the local rank (environment, else the node map) and,
    if the caller has imported torch already, pick and set the device now. What is found is
    kept in `process.local_rank`, `.local_rank_source` and `.device` (minipar.state)."""
    found = local_rank_from_env(os.environ)
    if found is None:
        found = _shared_memory_rank(comm)
    process.local_rank, process.local_rank_source = found
    process.device = None
    if "torch" in sys.modules:
        device()


def forget() -> None:
    process.local_rank, process.local_rank_source, process.device = None, "", None


def _shared_memory_rank(comm) -> tuple[int, str]:
    """(local rank, what said so) from the node map: one shared-memory split, made once."""
    found = nodes.nodes()
    return found.local_rank(comm.global_ranks[comm.rank]), found.source


def local_rank() -> int:
    """This rank's index among the ranks on its node (init() must have run)."""
    if process.local_rank is None:
        if process.world is None:
            raise NotInitializedError()
        remember(process.world)
    return process.local_rank


def device():
    """This rank's torch.device: cuda:(local rank % visible GPUs), set as the current CUDA
    device, or torch.device("cpu") where CUDA is unavailable."""
    if process.device is not None:
        return process.device
    import torch

    index = pick_index(local_rank(), torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if index is None:
        process.device = torch.device("cpu")
    else:
        torch.cuda.set_device(index)
        process.device = torch.device("cuda", index)
    return process.device


def describe() -> dict:
    """For doctor and the GPU check: local rank, its source, the device."""
    source = process.local_rank_source
    return {"local_rank": process.local_rank, "source": source, "device": str(device())}
