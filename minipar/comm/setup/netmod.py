"""Under `srun --mpi=pmi2` across nodes, the mpich wheel on its OFI netmod: UCX cannot start there.

The PyPI mpich wheel speaks PMI-1 to Slurm's pmi2 plugin, which reads each request with one
read() of at most 1024 bytes (`handle_pmi1_cmd`, src/plugins/mpi/pmi2/pmi1.c). The wheel's
default netmod, UCX, puts each node's address into PMI as a fixed 4096 bytes (`MPID_MAX_BC_SIZE`,
MPICH's src/mpid/ch4/netmod/ucx/ucx_init.c), sent in pieces whose requests can pass 1024 bytes:
the cut one fails MPI_Init ("mpi/pmi2: value not properly terminated"). OFI's addresses are tens
of bytes. Within one node nothing is put, so only steps on two nodes or more are switched.

    netmod_for(env, library_text) -> "ofi" or None    (the decision, from plain values)
    choose()                                          (before MPI_Init: sets it, says so once)

A user's own MPIR_CVAR_CH4_NETMOD is kept, and a site MPICH is left alone (it may speak PMI-2 or
PMIx, and know the cluster's network better). docs/cluster.md has the trace.
"""

from __future__ import annotations

import os
import sys

from minipar.comm.setup import mpisetup

WHEEL = "pypi.org/p/mpich"  # the wheel's "MPICH Custom Information" line names its PyPI page
NOTE = (
    "minipar: srun started this job on {nodes} nodes with the mpich wheel, whose default UCX "
    "network module sends Slurm's pmi2 plugin a message longer than it reads, so MPI_Init "
    "could fail there. Using MPICH's OFI module instead (MPIR_CVAR_CH4_NETMOD=ofi); set "
    "MPIR_CVAR_CH4_NETMOD yourself to choose another.\n"
)


def srun_nodes(env) -> int:
    """The nodes of the srun step that started this process through Slurm's PMI, else 0.
    Hydra's proxies, themselves started by srun inside an allocation, give their ranks a PMI_FD
    too, and MPI_LOCALRANKID: those ranks talk to hydra, which reads whole lines."""
    if "SLURM_JOB_ID" not in env or "SLURM_STEP_ID" not in env:
        return 0
    if not ("PMI_FD" in env or "PMI_PORT" in env) or "MPI_LOCALRANKID" in env:
        return 0
    return int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or 1)


def netmods(library_text: str) -> list[str]:
    """The ch4 netmods an MPICH library was built with, its default first ("MPICH Device:
    ch4:ucx ofi" -> ["ucx", "ofi"]); [] for another MPI."""
    for line in library_text.splitlines():
        if line.strip().startswith("MPICH Device:"):
            device = line.split(":", 1)[1].split()
            if device and device[0].startswith("ch4:"):
                return [device[0][4:], *device[1:]]
    return []


def netmod_for(env, library_text: str) -> str | None:
    """ "ofi" where srun's PMI starts the mpich wheel, UCX its default, on 2 nodes or more, and
    the user chose no netmod; else None (nothing to change)."""
    if "MPIR_CVAR_CH4_NETMOD" in env or srun_nodes(env) < 2 or WHEEL not in library_text:
        return None
    mods = netmods(library_text)
    return "ofi" if mods[:1] == ["ucx"] and "ofi" in mods else None


def choose(env=None) -> str | None:
    """Before MPI_Init (MPICH reads its CVARs there): set the netmod netmod_for picks, and say so
    on the step's rank 0. Returns it, or None. Loads libmpi only under a multi-node srun step."""
    env = os.environ if env is None else env
    if "MPIR_CVAR_CH4_NETMOD" in env or srun_nodes(env) < 2:
        return None
    MPI = mpisetup.load_mpi()  # libmpi loaded, MPI_Init not run (minipar runs it next)
    if MPI.Is_initialized():
        return None  # the program imported mpi4py.MPI first, which ran MPI_Init: too late
    chosen = netmod_for(env, MPI.Get_library_version())
    if chosen:
        env["MPIR_CVAR_CH4_NETMOD"] = chosen
        if env.get("SLURM_PROCID") == "0":
            sys.stderr.write(NOTE.format(nodes=srun_nodes(env)))
            sys.stderr.flush()
    return chosen
