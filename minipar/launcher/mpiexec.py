"""Launching ranks: find the mpiexec that belongs to the MPI mpi4py loads, and run a job under it.

`minipar run -n 4 script.py` is `mpiexec -n 4 python script.py` with the details a laptop gets
wrong: the right mpiexec (a system one next to the pip-installed MPICH hangs or mis-numbers
ranks), oversubscription when ranks outnumber cores (Open MPI refuses without a flag; MPICH's
busy polling would starve the ranks, so minipar's waits yield instead), Open MPI's consent to run
as root (containers, Colab and CI run as root), one OpenMP thread per rank, whole lines per rank
(minipar.launcher.relay), and a timeout that kills the whole job so nothing is left behind. The
command's options and messages are minipar/cli/run.py's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from minipar.comm.setup import mpisetup
from minipar.cost.links import EMULATED_LINK_ENV
from minipar.launcher import job_files, own_folder, shm_leftovers, stop
from minipar.launcher.cluster import mpi_args
from minipar.launcher.relay import Relay, tag_from_env


def mpi_library_version() -> str:
    """The MPI library's own version string, without initialising MPI (MPISetupError, with the
    fixes, when mpi4py finds no MPI library)."""
    return mpisetup.load_mpi().Get_library_version().replace("\0", "").strip()


def mpi_flavor() -> str:
    """'mpich', 'openmpi', or 'other', from the library's version string."""
    return mpisetup.flavor(mpi_library_version())


def find_mpiexec() -> str:
    """MINIPAR_MPIEXEC, else the mpiexec installed beside the loaded libmpi (the mpich wheel puts
    both in the environment's prefix), else the first mpiexec on PATH."""
    override = os.environ.get("MINIPAR_MPIEXEC")
    if override:
        return override
    candidates = []
    try:
        lib = mpisetup.library()["path"]
        if lib:
            candidates.append(os.path.join(os.path.dirname(os.path.dirname(lib)), "bin"))
    except ImportError:
        pass
    candidates.append(os.path.join(sys.prefix, "bin"))
    for folder in candidates:
        path = os.path.join(folder, "mpiexec")
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise FileNotFoundError(
            "no mpiexec found: pip install mpich (or set MINIPAR_MPIEXEC to your MPI's mpiexec)"
        )
    return found


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


ROOT_CONSENT = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
# Open MPI's launcher and daemons (PRRTE) keep a session folder each in TMPDIR, ompi.PID and
# prted.PID, removed as they end, not when they are killed (a node lost, a timeout): the job's
# go in a folder of its own, which the launcher removes however the job ends (job_files)
SESSION_BASE = "PRTE_MCA_prte_tmpdir_base"


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def command(
    n: int,
    argv: list[str],
    python: bool = True,
    relay=None,
    warm: bool = True,
    cluster=None,
    hosts: str | None = None,
    hostfile: str | None = None,
) -> tuple[list[str], dict]:
    """(the mpiexec command line, its environment) for n ranks running argv (python arguments,
    or a whole program when python is False: one starting with this very Python counts as
    python arguments); with a relay, each rank's output goes through it; warm=False: never
    through MINIPAR_FORK_SERVER's fork server (see warm_start). cluster: an EmulatedCluster
    that is up (launcher/cluster/): the launcher runs on its node0 and starts the others'
    proxies through the stand-in for ssh; hosts / hostfile: real hosts, passed through."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of ranks must be a positive integer, got {n!r}")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [find_mpiexec(), "-n", str(n)]
    openmpi = mpi_flavor() == "openmpi"
    if openmpi and is_root():  # Open MPI refuses root unless told twice; containers run as root
        for name in ROOT_CONSENT:
            env.setdefault(name, "1")
    if n > cores():
        env["MINIPAR_OVERSUBSCRIBED"] = "1"
        if openmpi and cluster is None:  # a node's slots are given: its ranks fit them
            cmd.append("--oversubscribe")
    flavor = "openmpi" if openmpi else "mpich"
    if cluster is not None:
        nodes_args, nodes_env = mpi_args.for_cluster(flavor, cluster, n)
        cmd += nodes_args
        env.update(nodes_env)
        # the link's rate, so `auto` prices it (cost.inter_link) and lessons can say it
        env[EMULATED_LINK_ENV] = "" if cluster.rate is None else f"{cluster.rate:g}"
        warm = False  # a rank forked by the fork server would run in its namespace, not a node's
    else:
        cmd += mpi_args.for_hosts(flavor, hosts, hostfile)
    if not python and argv[:1] == [sys.executable]:  # `minipar run script.py`: this Python
        python, argv = True, list(argv[1:])
    program = (
        [sys.executable, *(warm_start(env, argv) if warm else []), *argv] if python else list(argv)
    )
    if relay is not None:
        program = relay.wrap(program)
        relay.environ(env)
        if cluster is not None:
            relay.hosts = {cluster.address(k): cluster.hostname(k) for k in range(cluster.n_nodes)}
    if cluster is not None:  # the launcher itself runs on node0
        return cluster.on_node(0, cmd + program), env
    return cmd + program, env


FORK_SERVER_ENV = "MINIPAR_FORK_SERVER"


def warm_start(env: dict, argv: list[str]) -> list[str]:
    """The python arguments that put a rank in front of argv: none, or with
    MINIPAR_FORK_SERVER=SOCKET (the test suite's fork server, minipar.testing.zygote) a small
    stand-in that has each rank forked from a process that imported torch once (~2 s of a core
    saved per rank); the rank then runs argv as it would have."""
    address = env.get(FORK_SERVER_ENV)
    return ["-m", "minipar.testing.zygote", address] if address else []


def run(n: int, argv: list[str], timeout: float | None = None, capture: bool = False, cluster=None):
    """Run argv (python arguments) on n ranks (on an EmulatedCluster's nodes when given);
    returns the CompletedProcess (exit 124 and the whole job killed on timeout). Not captured,
    the ranks' output arrives in whole lines."""
    if capture:
        cmd, env = command(n, argv, cluster=cluster)
        return run_command(cmd, env, timeout, capture, cluster)
    relay = Relay(n, tag=tag_from_env())
    try:
        cmd, env = command(n, argv, relay=relay, cluster=cluster)
    except BaseException:
        relay.close()
        raise
    return run_relayed(cmd, env, relay, timeout, cluster)


def session_folder(env: dict) -> str | None:
    """For an Open MPI job: a new folder of the job's own for its session folders, named in
    env (SESSION_BASE), which JobFiles removes when the job ends; None for MPICH's, or where
    the caller named one."""
    if SESSION_BASE in env or mpi_flavor() != "openmpi":
        return None
    env[SESSION_BASE] = folder = own_folder.make("mpi")
    return folder


def run_relayed(cmd, env, relay, timeout: float | None = None, cluster=None):
    """Run cmd (built with this relay), forwarding the ranks' whole lines as they come. However
    the job ends (SIGTERM, SIGHUP or Ctrl-C to this process included: Terminated or
    KeyboardInterrupt raised once it is stopped), what it left in /dev/shm and /tmp is removed."""
    began, session = time.time(), session_folder(env)
    with stop.signals_raise() as state:
        try:
            proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        except BaseException:
            relay.close()
            job_files.remove_session(session)
            raise
        files = job_files.JobFiles(proc.pid, began, segments=cluster is None, session=session)
        try:
            status = relay.pump(proc, timeout)
        finally:
            state["removing"] = True
            stop.stop(proc)  # at once when it has ended: its group killed, nothing waits
            files.remove()
    if status == 124 and timeout is not None:
        sys.stderr.write(f"minipar: job killed after {timeout:g} s (timeout)\n")
    if status != 0:  # and any other segment of this user's made since, mapped by none
        shm_leftovers.since(began)
    return subprocess.CompletedProcess(cmd, status)


def run_command(cmd, env, timeout: float | None = None, capture: bool = False, cluster=None):
    """Run cmd in its own process group, so a timeout or Ctrl-C (SIGTERM, SIGHUP) kills every
    process it started; what the job left in /dev/shm and /tmp is removed however it ends."""
    kwargs = {"env": env, "start_new_session": True, "text": True}
    began, session = time.time(), session_folder(env)
    if capture:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with stop.signals_raise() as state:
        try:
            proc = subprocess.Popen(cmd, **kwargs)
        except BaseException:
            job_files.remove_session(session)
            raise
        files = job_files.JobFiles(proc.pid, began, segments=cluster is None, session=session)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop.stop(proc)  # what the job wrote before it ended stays in the pipes
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a process outside the group still holds a pipe
                out, err = "", ""
            err = (err or "") + f"\nminipar: job killed after {timeout:g} s (timeout)\n"
            return subprocess.CompletedProcess(cmd, 124, out, err)
        finally:  # leave no orphans behind, even when the launcher itself exited cleanly
            state["removing"] = True
            stop.stop(proc)
            files.remove()
            if proc.returncode != 0:  # and any other segment of this user's made since, unmapped
                shm_leftovers.since(began)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
