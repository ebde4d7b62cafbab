"""What a rank forked by the pool's fork server (minipar.testing.zygote) must look like to its
case (tests/test_zygote.py): its own process, its job's environment, torch's threads as the
launch environment says, MPI started through the launcher's own descriptors."""

import gc
import os
import sys

import minipar


def rank_is_itself():
    """Its pid is its own (the pool kills and asks ranks by pid); its rank and size are the
    job's, as MPI's PMI told it; the job's launch variables are in its environment."""
    world = minipar.init()
    print(f"pid {os.getpid()} ppid {os.getppid()} rank {world.rank} size {world.size}")
    assert os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK")) == str(world.rank)
    from mpi4py import MPI

    assert MPI.COMM_WORLD.Get_rank() == world.rank and MPI.COMM_WORLD.Get_size() == world.size


def torch_as_launched():
    """torch came loaded (the server imported it), with the rank's OMP_NUM_THREADS applied."""
    assert "torch" in sys.modules and "torch._dynamo" in sys.modules
    import torch

    want = int(os.environ.get("OMP_NUM_THREADS", "1"))
    assert torch.get_num_threads() == want, (torch.get_num_threads(), want)


def preloads_out_of_the_collectors_reach():
    """What the server preloaded is frozen (gc.freeze): a collection in a rank walks what the
    rank made, not torch's objects (0.2 s of a core per rank and batch, measured)."""
    import torch

    assert gc.get_freeze_count() > 50_000, gc.get_freeze_count()
    assert not any(obj is vars(torch) for obj in gc.get_objects()), "torch's objects are walked"


def cases(size):
    return {
        "rank_is_itself": rank_is_itself,
        "torch_as_launched": torch_as_launched,
        "preloads_out_of_the_collectors_reach": preloads_out_of_the_collectors_reach,
    }
