"""A cluster that stays up between jobs: a keeper process holds it until `minipar cluster down`.

    minipar cluster up --nodes 2 --link 2gbit [--slurm]   # a keeper starts, makes it, stays
    minipar cluster shell node0                           # a shell on node0: mpiexec, ssh node1
    minipar cluster status                                # the nodes, their cables' bytes
    minipar cluster down                                  # the keeper removes it all, exits

`minipar run --nodes` makes its nodes for one job and removes them when it ends. A standing
cluster is the same EmulatedCluster (nodes.py: namespaces, the switch, tc's cables; without
root, inside the keeper's user namespace), made and held by a keeper: a process of its own
session, detached from the terminal, that owns every name (minipar-KEEPER-JOB-...) and writes
what a shell needs into the cluster's folder (cluster.json). SIGTERM to the keeper (what
`down` sends) removes the cluster and the keeper exits; a keeper that dies otherwise (SIGKILL,
a reboot of its session) leaves names whose owner is gone, swept by the next `minipar cluster`,
`minipar run --nodes` or `minipar doctor` as any dead job's are (leftovers.py); without root
the kernel ends it all with the keeper (rootless.py). One standing cluster a user.

A node's shell is entered as the launcher enters node0 (enter.py: its network namespace, its
hostname, the cluster's hosts file over /etc/hosts), with PATH starting at the cluster's bin/:
`ssh` there is the stand-in, so `ssh node1 hostname` and plain `mpiexec -hosts
node0:2,node1:2 -n 4 python x.py` (hydra's ssh launcher; Open MPI's too) reach the other
nodes, and the MPIs are told to carry bytes between nodes over eth0 (mpi_args.py's variables).
"""

from __future__ import annotations

import glob
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time

from minipar.launcher.cluster import leftovers, mpi_args, needs, rootless
from minipar.launcher.cluster import slurm as slurms
from minipar.launcher.cluster.enter import HOSTS_ENV, TABLE_ENV, argv_on_node
from minipar.launcher.cluster.nodes import PREFIX, EmulatedCluster, EmulationError

STATE = "cluster.json"
UP_LIMIT = 120.0  # seconds the keeper may take to say the cluster is up (Slurm's daemons too)


def find() -> dict | None:
    """This user's standing cluster (its cluster.json), or None; dead keepers' are swept."""
    leftovers.sweep()
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}*-files-*", STATE)):
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            with open(path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            continue
        if leftovers.owner_alive(state["keeper"], state["since"]):
            return state
    return None


def up(n_nodes: int, link: str, slurm: bool = False) -> dict:
    """Start a keeper that makes the cluster and holds it; its state once it is up."""
    EmulatedCluster(n_nodes, link)  # the arguments checked before anything starts
    if slurm:
        slurms.check()
    if find() is not None:
        raise EmulationError("a cluster is up already (minipar cluster status); take it down "
                             "first: minipar cluster down")  # fmt: skip
    needs.check("minipar cluster up")
    cmd = [sys.executable, "-m", "minipar.launcher", "keep", str(n_nodes), link,
           "slurm" if slurm else "-"]  # fmt: skip
    keeper = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)  # fmt: skip
    said = _until_up(keeper, UP_LIMIT)
    if not said.startswith("up "):
        keeper.terminate()  # it removes what it made; SIGKILLed, the sweep does
        try:
            rest = keeper.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            keeper.kill()
            rest = keeper.communicate()[0]
            leftovers.sweep()
        raise EmulationError(f"the cluster did not come up: {(said + rest).strip()}")
    keeper.stdout.close()  # the keeper writes to its log from now on
    with open(said[3:].strip()) as f:
        return json.load(f)


def _until_up(proc: subprocess.Popen, limit: float) -> str:
    """The keeper's `up STATEFILE` line, or all it said before it ended or ran out of time."""
    said, end = "", time.monotonic() + limit
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while sel.select(max(0.0, end - time.monotonic())):
            line = proc.stdout.readline()
            if not line or line.startswith("up "):
                return line or said
            said += line
    return said + f"(not up after {limit:g} s)"


def down(limit: float = 30.0) -> dict | None:
    """Ask the keeper to remove the cluster (SIGTERM) and wait for it; None if none was up."""
    state = find()
    if state is None:
        return None
    _signal(state["keeper"], signal.SIGTERM)
    end = time.monotonic() + limit
    while leftovers.owner_alive(state["keeper"], state["since"]) and time.monotonic() < end:
        time.sleep(0.05)
    if leftovers.owner_alive(state["keeper"], state["since"]):
        _signal(state["keeper"], signal.SIGKILL)  # then its names are a dead owner's: swept
        time.sleep(0.1)
    leftovers.sweep()
    return state


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- a node's shell ------------------------------------------------------------------------------
def node_index(state: dict, node: str) -> int:
    names = [n["hostname"] for n in state["nodes"]]
    if node not in names:
        raise ValueError(f"no node {node!r} in the cluster (its nodes: {', '.join(names)})")
    return names.index(node)


def shell_command(state: dict, node: str, argv: list[str]) -> tuple[list[str], dict]:
    """(command line, environment) of argv (or an interactive shell) on the node."""
    k = node_index(state, node)
    entry = state["nodes"][k]
    env = shell_env(state)
    if not argv:
        argv = interactive(os.environ.get("SHELL") or "/bin/bash", node, env)
    cmd = [*_inside(state), *argv_on_node(entry["namespace"], node, state["hosts_file"], argv)]
    return cmd, env


def interactive(shell: str, node: str, env: dict) -> list[str]:
    """The node's interactive shell, reading no rc file: a pyenv or conda line in ~/.bashrc
    would put another python first on PATH, and the documented `mpiexec ... python x.py`
    would fail with "No module named 'mpi4py'" on every rank. The prompt names the node."""
    name = os.path.basename(shell)
    env["PS1"] = f"[{node}] \\w\\$ " if name == "bash" else f"[{node}] %~ %# "
    env.pop("ENV", None)  # sh reads the file $ENV names when interactive
    if name == "bash":
        return [shell, "--noprofile", "--norc", "-i"]
    if name == "zsh":
        return [shell, "-f", "-i"]  # no startup files
    return [shell, "-i"]


def _inside(state: dict) -> list[str]:
    """The words that enter the cluster's user namespace (rootless), else none."""
    return rootless.inside(state["holder"]) if state["holder"] else []


def shell_env(state: dict) -> dict:
    """The environment of a node's shell: the stand-in as ssh, each MPI told of eth0."""
    env = dict(os.environ, **state["env"])
    python_bin = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join([state["bin"], python_bin, os.environ.get("PATH", "")])
    if sys.prefix != sys.base_prefix:  # a virtual environment, activated or not: say so
        env["VIRTUAL_ENV"] = sys.prefix
    return env


# -- the keeper ------------------------------------------------------------------------------------
def keep(n_nodes: int, link: str, slurm: bool) -> int:
    """Make the cluster, say `up STATEFILE`, hold it until SIGTERM/SIGHUP/SIGINT, remove it."""

    def asked(signum, frame):
        raise _Down(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, asked)
    cluster = EmulatedCluster(n_nodes, link)
    daemons = None
    try:
        cluster.up()
        if slurm:
            daemons = slurms.start(cluster)
        path = write_state(cluster, daemons)
        print(f"up {path}", flush=True)
        _to_log(cluster.folder)
        while True:
            signal.pause()
    except _Down:
        pass
    except Exception as error:  # said to `minipar cluster up`, which waits for a line
        print(f"{type(error).__name__}: {error}", flush=True)
        return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # the removal is not cut short
        if daemons is not None:
            daemons.stop()
        cluster.down()
    return 0


class _Down(BaseException):
    """The keeper was asked to take the cluster down (SIGTERM, SIGHUP or SIGINT)."""


def _to_log(folder: str) -> None:
    """stdout and stderr to the cluster's log: `up` has read its line and stops listening."""
    fd = os.open(os.path.join(folder, "keeper.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def write_state(cluster: EmulatedCluster, daemons=None) -> str:
    """cluster.json in the cluster's folder: what status, shell and down read."""
    bin_dir = os.path.join(cluster.folder, "bin")
    os.makedirs(bin_dir)
    ssh = mpi_args.write_stand_in(bin_dir, "ssh")  # first on a node shell's PATH
    env = shell_variables(cluster, ssh)
    if daemons is not None:
        env.update(daemons.env)
    state = {
        "keeper": os.getpid(),
        "since": time.time(),
        "link": cluster.rate,
        "folder": cluster.folder,
        "bin": bin_dir,
        "hosts_file": cluster.hosts_file,
        "holder": cluster.holder.pid if cluster.holder else None,
        "slurm": daemons is not None,
        "env": env,
        "nodes": [
            {
                "hostname": cluster.hostname(k),
                "address": cluster.address(k),
                "namespace": cluster.namespace(k),
            }
            for k in range(cluster.n_nodes)
        ],
    }
    path = os.path.join(cluster.folder, STATE)
    with open(path + ".part", "w") as f:
        json.dump(state, f, indent=1)
    os.rename(path + ".part", path)  # whole or absent
    return path


def shell_variables(cluster: EmulatedCluster, ssh: str) -> dict:
    """What plain mpiexec/mpirun in a node's shell need: the stand-in as their ssh, the bytes
    between nodes over eth0 (mpi_args.py says why), the nodes' table for the stand-in."""
    eth = mpi_args.INTERFACE
    env = {
        TABLE_ENV: cluster.table(), HOSTS_ENV: cluster.hosts_file,
        "HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": ssh,
        "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": eth, "FI_PROVIDER": "tcp", "FI_TCP_IFACE": eth,
        "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,sm,tcp", "OMPI_MCA_btl_tcp_if_include": eth,
        "PRTE_MCA_plm_ssh_agent": ssh,
    }  # fmt: skip
    if os.geteuid() == 0:  # Open MPI runs as root when told twice (launcher/mpiexec.py)
        env.update(dict.fromkeys(("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"), "1"))
    if os.cpu_count() and os.cpu_count() < 2 * cluster.n_nodes:  # nodes share this machine
        env["MINIPAR_OVERSUBSCRIBED"] = "1"
    return env


def interfaces(state: dict) -> list[dict]:
    """Each node's eth0: bytes sent and received so far (ip -s), for `minipar cluster status`."""
    rows = []
    for entry in state["nodes"]:
        cmd = [*_inside(state), "ip", "-n", entry["namespace"], "-s", "-j", "link", "show",
               "eth0"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        try:
            stats = json.loads(done.stdout)[0]["stats64"]
            rows.append({**entry, "tx": stats["tx"]["bytes"], "rx": stats["rx"]["bytes"]})
        except (ValueError, IndexError, KeyError):
            rows.append({**entry, "tx": None, "rx": None})
    return rows
