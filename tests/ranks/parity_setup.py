"""Run under mpiexec on 2 ranks (tests/test_parity.py): torch.distributed's set-up calls,
four times over, as a torch program makes them with `import minipar as dist` (the tutorial's
MPI recipe first)."""

import datetime
import socket

import numpy as np

import minipar as dist


def check_world(backend):
    assert dist.is_initialized() and dist.get_backend() == backend, dist.get_backend()
    x = np.full(3, dist.get_rank() + 1.0)
    dist.all_reduce(x)
    assert (x == 3).all(), x


def check_p2p():
    import torch

    t = torch.zeros(2)
    if dist.get_rank() == 0:
        dist.send(torch.ones(2), dst=1)
    else:
        assert dist.recv(t) == 0 and (t == 1).all(), t


def mpi_recipe():
    """The tutorial's `init_process_group('mpi', rank=0, world_size=0)` on every rank: MPI's
    rank and size count; a world_size other than MPI's is refused on every rank."""
    try:
        dist.init_process_group("mpi", rank=1, world_size=5)
    except ValueError as error:
        assert "world_size=5 but MPI started 2 ranks" in str(error), str(error)
    else:
        raise AssertionError("world_size=5 on 2 ranks was accepted")
    assert not dist.is_initialized()
    dist.init_process_group("mpi", rank=0, world_size=0)
    check_world("mpi")
    dist.destroy_process_group()


def main():
    mpi_recipe()
    dist.init_process_group("mpi", rank=-1, world_size=2, timeout=datetime.timedelta(seconds=20))
    check_world("mpi")
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    dist.destroy_process_group(dist.new_group([1, 0]))  # frees the MPI communicator
    dist.destroy_process_group()
    assert not dist.is_initialized()

    import torch.distributed as tdist

    dist.init_process_group("gloo", timeout=20)  # brought up over MPI: no init_method needed
    check_world("gloo")
    check_p2p()
    dist.destroy_process_group()
    assert not dist.is_initialized() and not tdist.is_initialized()

    port = None
    if rank == 0:  # picked just before the init that binds it, so the race for it is short
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = MPI.COMM_WORLD.bcast(port)
    dist.init_process_group(
        backend="gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    check_world("gloo")
    check_p2p()
    group = dist.new_group([0, 1])
    dist.destroy_process_group(group)
    dist.destroy_process_group()
    assert not dist.is_initialized() and not tdist.is_initialized()
    print("setup ok", flush=True)


main()
