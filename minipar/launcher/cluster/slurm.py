"""Slurm on the emulated nodes: munge, slurmctld on node0, one slurmd on every node.

    daemons = start(cluster)     # an EmulatedCluster that is up; Slurm's files in its folder
    ...srun / sbatch / squeue / scancel from a node's shell (SLURM_CONF: daemons.env)
    daemons.stop()               # then cluster.down() removes what is left, files included

What a course cluster runs, on one machine: `srun -N 2 --ntasks-per-node=2 --mpi=pmi2 python
x.py` starts two tasks on each emulated node (slurmd's slurmstepd forks them inside its node's
namespaces, so they have its hostname, its eth0 and its cable), and MPICH's ranks learn their
node from Slurm's PMI-2 server, as on a real cluster; Open MPI's from its PMIx server (`srun
--mpi=pmix`, where libpmix-dev is installed too: Slurm's plugin opens libpmix.so). Debian's
slurm-wlm (22.05) and munge (apt-get install -y slurm-wlm munge), nothing installed by minipar,
nothing of the machine's own configuration read or written: every file (slurm.conf, munge's
key and socket, the state, the spool, each node's TmpFS, the logs) lives in the cluster's
folder and goes with it.

    munged      node0, a socket in the folder (a Unix socket: every node reaches it)
    slurmctld   node0 (10.200.0.1:6817), the head that is a compute node too
    slurmd      nodeK (its address:6818), its hostname nodeK, its hosts file

Each node claims CPUS cores (config_overrides: Slurm believes the configuration, not the
machine), since every node shares this machine's cores; tasks are tracked by their parent
process (proctrack/linuxproc) and not bound (task/none): no cgroups needed, which containers
and user namespaces seldom give.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time

from minipar.launcher.cluster import rootless
from minipar.launcher.cluster.nodes import EmulationError

DAEMONS = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "srun": "slurm-client"}
INSTALL = "apt-get update && apt-get install -y slurm-wlm munge"
CPUS = 8  # cores each node claims (they share the machine's): room for --ntasks-per-node up to 8
UP_LIMIT = 60.0  # seconds for every node to report idle


def missing() -> list[str]:
    """The Slurm and munge programs this machine lacks (empty: none)."""
    return [f"{name} ({package})" for name, package in DAEMONS.items() if not shutil.which(name)]


def check() -> None:
    """Refuse, before anything starts, where Slurm cannot run on the nodes: not installed, or
    no root (slurmctld and slurmd, started as root, drop their supplementary groups with
    setgroups(2), which a user namespace made without root refuses)."""
    if rootless.wanted():
        raise EmulationError(
            "--slurm needs root: Slurm's daemons call setgroups(), which a user namespace "
            "made without root refuses; without root, a standing cluster without --slurm "
            "(mpiexec -hosts node0:2,node1:2 from its node0) is the practice that remains"
        )
    lacks = missing()
    if lacks:
        raise EmulationError(
            f"--slurm needs Slurm and munge, and this machine lacks {', '.join(lacks)}: as root, "
            f"{INSTALL} (docs/cluster.md, 'Practise on Slurm'); minipar needs none of it"
        )


def config(cluster, folder: str) -> str:
    """slurm.conf for the cluster's nodes, every path inside `folder`."""
    nodes = "\n".join(
        f"NodeName={cluster.hostname(k)} NodeAddr={cluster.address(k)} CPUs={CPUS} State=UNKNOWN"
        for k in range(cluster.n_nodes)
    )
    return f"""\
ClusterName=minipar
SlurmctldHost={cluster.hostname(0)}({cluster.address(0)})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.socket
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
TmpFS={folder}/tmp
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=pmi2
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=60
{nodes}
PartitionName=emulated Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class Daemons:
    """Slurm's and munge's processes on a cluster, and what a shell needs to reach them."""

    def __init__(self, cluster, folder: str):
        self.cluster, self.folder = cluster, folder
        self.procs: list[subprocess.Popen] = []
        self.env = {"SLURM_CONF": os.path.join(folder, "slurm.conf")}

    def spawn(self, k: int, argv: list[str], log: str) -> None:
        """argv on node k, its output in the folder's log."""
        with open(os.path.join(self.folder, log), "ab") as out:
            cmd = self.cluster.on_node(k, argv)
            env = dict(os.environ, **self.env)
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                               stderr=subprocess.STDOUT, env=env))  # fmt: skip

    def on_node0(self, argv: list[str]) -> subprocess.CompletedProcess:
        """A Slurm client command on node0 (the controller's address is reachable there)."""
        env = dict(os.environ, **self.env)
        return subprocess.run(self.cluster.on_node(0, argv), capture_output=True, text=True,
                              timeout=30, env=env, check=False)  # fmt: skip

    def stop(self) -> None:
        """SIGTERM every daemon, then SIGKILL what is left after 3 s (the nodes' removal
        kills whatever else runs on them: job steps)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        end = time.monotonic() + 3.0
        for proc in self.procs:
            try:
                proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start(cluster) -> Daemons:
    """munged, slurmctld and a slurmd a node, in the cluster's folder; back once every node is
    idle (EmulationError with the logs' last lines otherwise; what started is stopped)."""
    check()
    folder = os.path.join(cluster.folder, "slurm")
    for sub in ("", "state", "munge", "tmp"):
        os.makedirs(os.path.join(folder, sub), mode=0o700, exist_ok=True)
    daemons = Daemons(cluster, folder)
    try:
        _write(os.path.join(folder, "slurm.conf"), config(cluster, folder), 0o644)
        _write(os.path.join(folder, "munge.key"), secrets.token_bytes(1024), 0o600)
        daemons.spawn(0, _munged(folder), "munged.out")
        _wait_for(lambda: os.path.exists(os.path.join(folder, "munge.socket")), "munged", folder)
        conf = daemons.env["SLURM_CONF"]
        daemons.spawn(0, ["slurmctld", "-D", "-f", conf], "slurmctld.out")
        for k in range(cluster.n_nodes):
            daemons.spawn(k, _slurmd(folder, conf, cluster.hostname(k)),
                          f"slurmd-{cluster.hostname(k)}.out")  # fmt: skip
        _wait_for(lambda: _all_idle(daemons), "every node idle in sinfo", folder)
    except BaseException:
        daemons.stop()
        raise
    return daemons


def _slurmd(folder: str, conf: str, node: str) -> list[str]:
    """slurmd on `node`, whose TmpFS (folder/tmp, where PMIx makes each step's folder under a
    name without the node's) is a folder of the node's own, bound there in its mount
    namespace: the nodes share this machine's disk, a cluster's nodes would not."""
    own, spool = os.path.join(folder, f"tmp-{node}"), os.path.join(folder, f"spool-{node}")
    for path in (own, spool):
        os.makedirs(path, mode=0o755, exist_ok=True)
    bind = f'mount --bind {own} {folder}/tmp && exec "$@"'
    return ["sh", "-c", bind, "sh", "slurmd", "-D", "-f", conf, "-N", node]


def _munged(folder: str) -> list[str]:
    return ["munged", "--foreground", "--force", f"--key-file={folder}/munge.key",
            f"--socket={folder}/munge.socket", f"--log-file={folder}/munged.log",
            f"--pid-file={folder}/munge/munged.pid",
            f"--seed-file={folder}/munge/munged.seed"]  # fmt: skip


def _write(path: str, data, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with open(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def _all_idle(daemons: Daemons) -> bool:
    done = daemons.on_node0(["sinfo", "-h", "-N", "-o", "%N %T"])
    states = [line.split()[1] for line in done.stdout.splitlines() if len(line.split()) == 2]
    return len(states) == daemons.cluster.n_nodes and all(s == "idle" for s in states)


def _wait_for(ready, what: str, folder: str) -> None:
    end = time.monotonic() + UP_LIMIT
    while not ready():
        if time.monotonic() > end:
            raise EmulationError(f"Slurm did not come up ({what}) within {UP_LIMIT:g} s; "
                                 f"{_tails(folder)}")  # fmt: skip
        time.sleep(0.2)


def _tails(folder: str) -> str:
    """The last lines of every log in the folder: what a daemon said before it gave up."""
    said = []
    for name in sorted(os.listdir(folder)):
        if name.endswith((".log", ".out")):
            with open(os.path.join(folder, name), errors="replace") as f:
                lines = f.read().strip().splitlines()[-3:]
            said.append(f"{name}: " + " | ".join(lines))
    return "; ".join(said) or "no logs"
