"""Issue 69: the mpich wheel under `srun --mpi=pmi2` across nodes (comm/setup/netmod.py), and
MPI_Finalize on MPICH's OFI netmod with minipar's shared windows open (comm/transport/shm.py).

- which netmod is chosen, from plain values: the wheel's own MPI_Get_library_version text and
  the environment Slurm 22.05's pmi2 plugin gives a task (both copied from a task on the
  emulated nodes);
- a job whose ranks leave shared windows open ends with status 0 on OFI (mpiexec on this
  machine; without minipar freeing them first, MPICH's MPI_Finalize fails on every rank:
  "OFI call fabricclose failed ... Device or resource busy", exit 15).
The same job under srun on two emulated nodes is in test_cluster_slurm.py (the long checks).
"""

import os
import subprocess
import sys

import pytest

from minipar import launcher
from minipar.comm.setup import netmod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "shm_at_exit.py")
WHEEL_TEXT = """MPICH Version:      5.0.2
MPICH Release date: Fri Sep 25 20:45:26 UTC 2026
MPICH ABI:          18:2:6
MPICH Device:       ch4:ucx ofi
MPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker
MPICH CC:           cc
MPICH features:     threadcomm
MPICH Custom Information:	https://pypi.org/p/mpich/5.0.2/
"""
SITE_TEXT = WHEEL_TEXT.replace("https://pypi.org/p/mpich/5.0.2/", "")  # built at the site
OPEN_MPI_TEXT = "Open MPI v5.0.8, package: Open MPI, ident: 5.0.8, repo rev: v5.0.8\n"
SRUN_TASK = {  # what srun -N 2 --mpi=pmi2 gave a task (one rank's view)
    "SLURM_JOB_ID": "11",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_PROCID": "0",
    "PMI_FD": "11",
    "PMI_JOBID": "11.0",
    "PMI_RANK": "0",
    "PMI_SIZE": "2",
}


def test_netmods_are_read_from_the_device_line():
    assert netmod.netmods(WHEEL_TEXT) == ["ucx", "ofi"]
    assert netmod.netmods(WHEEL_TEXT.replace("ch4:ucx ofi", "ch4:ofi")) == ["ofi"]
    assert netmod.netmods(OPEN_MPI_TEXT) == []


def test_ofi_is_chosen_only_for_the_wheel_under_srun_on_two_nodes_or_more():
    assert netmod.netmod_for(SRUN_TASK, WHEEL_TEXT) == "ofi"
    assert netmod.netmod_for(dict(SRUN_TASK, SLURM_STEP_NUM_NODES="4"), WHEEL_TEXT) == "ofi"
    port = {k: v for k, v in SRUN_TASK.items() if k != "PMI_FD"} | {"PMI_PORT": "node0:5"}
    assert netmod.netmod_for(port, WHEEL_TEXT) == "ofi"
    unchanged = {
        "the user chose": dict(SRUN_TASK, MPIR_CVAR_CH4_NETMOD="ucx"),
        "one node (nothing is put)": dict(SRUN_TASK, SLURM_STEP_NUM_NODES="1"),
        "hydra inside the allocation": dict(SRUN_TASK, MPI_LOCALRANKID="0"),
        "srun --mpi=none": {k: v for k, v in SRUN_TASK.items() if not k.startswith("PMI")},
        "the batch script": {k: v for k, v in SRUN_TASK.items() if k != "SLURM_STEP_ID"},
        "mpiexec, no Slurm": {"PMI_FD": "7", "PMI_RANK": "0", "PMI_SIZE": "2"},
    }
    for why, env in unchanged.items():
        assert netmod.netmod_for(env, WHEEL_TEXT) is None, why
    for text in (SITE_TEXT, OPEN_MPI_TEXT, WHEEL_TEXT.replace("ch4:ucx ofi", "ch4:ucx")):
        assert netmod.netmod_for(SRUN_TASK, text) is None, text


def test_choose_sets_it_and_rank_0_says_so_once(monkeypatch, capsys):
    class Unstarted:  # libmpi loaded, MPI_Init not run
        Is_initialized = staticmethod(lambda: False)
        Get_library_version = staticmethod(lambda: WHEEL_TEXT)

    monkeypatch.setattr(netmod.mpisetup, "load_mpi", lambda: Unstarted)
    envs = [dict(SRUN_TASK, SLURM_PROCID=str(r), PMI_RANK=str(r)) for r in range(4)]
    assert [netmod.choose(env) for env in envs] == ["ofi"] * 4
    assert all(env["MPIR_CVAR_CH4_NETMOD"] == "ofi" for env in envs)
    said = capsys.readouterr().err
    assert said.count("minipar: ") == 1 and "MPIR_CVAR_CH4_NETMOD=ofi" in said, said
    assert netmod.choose(dict(SRUN_TASK, MPIR_CVAR_CH4_NETMOD="ucx")) is None


@pytest.mark.own_job
@pytest.mark.cold  # MPICH reads MPIR_CVAR_CH4_NETMOD in MPI_Init: ranks must start fresh
@pytest.mark.skipif(launcher.mpiexec.mpi_flavor() != "mpich", reason="MPICH's OFI netmod")
@pytest.mark.parametrize("ending", ["script end", "finalize"])
def test_open_shared_windows_end_with_status_0_on_ofi(ending):
    """Two ranks on this machine, OFI's tcp provider: the sums are right (1 + 2 on the node and
    in the world) and the job ends with status 0, MPI_Finalize's fabric close included."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", MINIPAR_TIMEOUT="20",
               MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp")  # fmt: skip
    argv = [launcher.find_mpiexec(), "-n", "2", sys.executable, SCRIPT]
    argv += ["finalize"] if ending == "finalize" else []
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "fabricclose" not in done.stderr, done.stderr[-3000:]
    rows = sorted(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("SUMS"))
    assert rows == [["0", "3", "3", "ofi"], ["1", "3", "3", "ofi"]], done.stdout
