"""Which device a rank picks: the local rank from each launcher's environment (pure functions,
no ranks), modulo the visible GPUs; and the staged path's chunk arithmetic."""

import pytest

import minipar
from minipar.comm.transport import staging
from minipar.runtime import devices


@pytest.mark.parametrize(
    "env,rank,source",
    [
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_RANK": "11"}, 3, "Open MPI"),
        ({"MPI_LOCALRANKID": "1", "PMI_RANK": "5", "MPI_LOCALNRANKS": "4"}, 1, "MPICH Hydra"),
        ({"MV2_COMM_WORLD_LOCAL_RANK": "2"}, 2, "MVAPICH"),
        ({"LOCAL_RANK": "7", "RANK": "15", "WORLD_SIZE": "16"}, 7, "torchrun"),
        ({"SLURM_LOCALID": "0", "SLURM_PROCID": "8"}, 0, "Slurm"),
    ],
)
def test_local_rank_of_each_launcher(env, rank, source):
    got, where = devices.local_rank_from_env(env)
    assert got == rank and source in where


def test_inner_launcher_wins():
    """mpiexec inside a Slurm allocation: the batch step's SLURM_LOCALID (0 for every rank mpiexec
    starts) must not win over the MPI launcher's own variable; torchrun under Slurm likewise."""
    assert devices.local_rank_from_env({"SLURM_LOCALID": "0", "MPI_LOCALRANKID": "3"})[0] == 3
    env = {"SLURM_LOCALID": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "2"}
    assert devices.local_rank_from_env(env)[0] == 2
    assert devices.local_rank_from_env({"SLURM_LOCALID": "0", "LOCAL_RANK": "5"})[0] == 5


def test_no_launcher_and_bad_values():
    assert devices.local_rank_from_env({"PMI_RANK": "0", "RANK": "3"}) is None
    assert devices.local_rank_from_env({"LOCAL_RANK": "", "SLURM_LOCALID": "1"})[0] == 1
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(ValueError, match=f"MPI_LOCALRANKID={bad!r}"):
            devices.local_rank_from_env({"MPI_LOCALRANKID": bad})


def test_device_index_wraps_and_sharing_is_counted():
    assert [devices.pick_index(r, 2) for r in range(5)] == [0, 1, 0, 1, 0]
    assert devices.pick_index(3, 0) is None  # no GPU: the CPU
    assert devices.pick_index(3, 8) == 3
    assert devices.ranks_per_device(4, 1) == 4  # four ranks on one GPU
    assert devices.ranks_per_device(3, 2) == 2
    assert devices.ranks_per_device(8, 8) == 1
    assert devices.ranks_per_device(2, 0) == 0


def test_device_before_init_says_so():
    if minipar.is_initialized():
        pytest.skip("this process already initialised minipar")
    with pytest.raises(minipar.NotInitializedError):
        minipar.device()


def test_chunk_bounds():
    assert staging.bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert staging.bounds(8, 4) == [(0, 4), (4, 8)]
    assert staging.bounds(4, 4) == [(0, 4)]  # one chunk: plain staging
    assert staging.bounds(0, 4) == [(0, 0)]
    assert staging.bounds(100, 0) == [(0, 100)]  # 0 turns pipelining off
    pieces = staging.bounds(64 << 20, staging.DEFAULT_CHUNK)
    assert len(pieces) == 32 and pieces[-1][1] == 64 << 20


def test_chunk_size_from_environment(monkeypatch):
    monkeypatch.delenv("MINIPAR_STAGE_CHUNK", raising=False)
    assert staging.chunk_bytes() == staging.DEFAULT_CHUNK
    monkeypatch.setenv("MINIPAR_STAGE_CHUNK", "65536")
    assert staging.chunk_bytes() == 65536
    for bad in ("-5", "1M"):
        monkeypatch.setenv("MINIPAR_STAGE_CHUNK", bad)
        with pytest.raises(ValueError, match=f"MINIPAR_STAGE_CHUNK.*{bad!r}"):
            staging.chunk_bytes()
