"""torch.distributed's set-up and tear-down, so that a torch program runs with `import minipar as
dist`: init_process_group, destroy_process_group, is_available.

    dist.init_process_group("mpi")                  # under mpiexec / srun: the MPI transport
    dist.init_process_group("gloo", init_method="tcp://10.0.0.1:29500", rank=r, world_size=n)
    ...
    dist.destroy_process_group()

"gloo" and "nccl" start torch.distributed with that backend (torch's own init_process_group,
same arguments) and minipar then runs its own algorithms over torch's point-to-point (the torch
transport, comm/transport/torch.py); torch's collectives are never used. Under mpiexec with no
init_method, MASTER_ADDR or store, the torch group is brought up over MPI (rank 0 picks a port).
"""

from __future__ import annotations

import datetime
import os

from minipar.comm.transport import torch as torch_comm
from minipar.comm.transport.base import env_timeout
from minipar.runtime import world
from minipar.state import process

BACKENDS = ("mpi", "gloo", "nccl")


def is_available() -> bool:
    return True


def _seconds(timeout) -> float:
    if timeout is None:
        return env_timeout()
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
        raise ValueError(
            f"timeout must be a positive timedelta or number of seconds, got {timeout!r}"
        )
    return float(seconds)


def _default_backend() -> str:
    if world.detect_backend() == "mpi" and any(v in os.environ for v in world.MPI_ENV):
        return "mpi"
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(
    backend=None,
    init_method=None,
    timeout=None,
    world_size: int = -1,
    rank: int = -1,
    store=None,
    group_name: str = "",
    pg_options=None,
    device_id=None,
) -> None:
    """Start minipar's default group with torch.distributed's arguments (see the module's text).

    backend None: "mpi" under an MPI launcher, else "nccl" with a GPU, else "gloo". timeout (a
    timedelta or seconds) bounds every wait, minipar's and torch's.

    With "mpi" the launcher decides rank and size, as with torch's MPI backend: `rank` is
    ignored whatever it is (the tutorial's recipe passes rank=0 on every rank), and so is a
    world_size of 0, -1 or None. The one contradiction still refused: a positive world_size
    other than the number of ranks MPI started (a program sized for another world), a
    ValueError on every rank alike (torch only warns)."""
    name = backend.lower() if isinstance(backend, str) else backend
    if name is not None and name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)} (or None), got {backend!r}")
    seconds = _seconds(timeout)
    if world.is_initialized() and not _take_over_launched(name):
        raise ValueError(
            "trying to initialize the default process group twice! (minipar is already "
            "initialised; call destroy_process_group() first)"
        )
    name = name or _default_backend()
    if name == "mpi":
        comm = world.init("mpi", timeout=seconds)
        if world_size not in (-1, 0, None, comm.size):
            world.finalize()
            raise ValueError(
                f"world_size={world_size!r} but MPI started {comm.size} ranks; with "
                "backend='mpi' the launcher decides (pass world_size=0 or -1, or leave it out)"
            )
        return
    _start_torch(
        name, init_method, seconds, world_size, rank, store, group_name, pg_options, device_id
    )
    world.init("torch", timeout=seconds)
    process.owns_torch = True


def _take_over_launched(name) -> bool:
    """minipar.launch initialised minipar before calling fn: fn's own init_process_group takes
    that world over ("mpi", or None under MPI: the same ranks) or replaces it ("gloo",
    "nccl": the launch's MPI world is let go first)."""
    if not process.launched_world:
        return False
    process.launched_world = False
    if (name or _default_backend()) != "mpi":
        world.finalize()
    return True


def _start_torch(
    backend, init_method, seconds, world_size, rank, store, group_name, pg_options, device_id
) -> None:
    import torch.distributed as dist  # here, not at the top: `minipar.init_process_group` is light

    if dist.is_initialized():
        raise ValueError(
            "torch.distributed is already initialised; minipar adopts it with minipar.init() "
            "instead of init_process_group"
        )
    under_mpi = any(v in os.environ for v in world.MPI_ENV)
    if init_method is None and store is None and "MASTER_ADDR" not in os.environ and under_mpi:
        from mpi4py import MPI

        torch_comm.init_from_mpi(MPI.COMM_WORLD, backend, seconds)
        return
    extra = {"pg_options": pg_options, "device_id": device_id, "store": store}
    dist.init_process_group(
        backend,
        init_method=init_method,
        timeout=datetime.timedelta(seconds=seconds),
        world_size=world_size,
        rank=rank,
        group_name=group_name,
        **{k: v for k, v in extra.items() if v is not None},
    )


def destroy_process_group(group=None) -> None:
    """group None (or the default group): stop minipar, and torch.distributed if
    init_process_group started it. Another group: release its transport resources (every
    member calls it; the group must not be used afterwards)."""
    if group is None or group is process.world:
        owns, process.owns_torch = process.owns_torch, False
        world.finalize()
        if owns:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        return
    comm = world.resolve(group)
    if comm.backend == "torch":
        import torch.distributed as dist

        dist.destroy_process_group(comm.group)
    elif comm.backend == "mpi":
        comm.mpi.Free()
