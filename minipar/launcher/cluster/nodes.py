"""The emulated nodes of one job: namespaces, a switch, cables; made whole, removed whole.

    cluster = EmulatedCluster(n_nodes=2, link="2gbit")
    with cluster:                       # up(): made; down() at the end, however the job ends
        ...                             # cluster.hosts: ["10.200.0.1", "10.200.0.2"]

What one job makes (every name starts minipar-OWNER-JOB-, OWNER the pid of the process that
made it, JOB random, so two jobs never touch each other's and a dead owner's are found later):

    minipar-OWNER-JOB-switch     a namespace holding the switch: bridge br0, ports n0, n1, ...
    minipar-OWNER-JOB-node0      a namespace with eth0 (10.200.0.1/24), the other end of n0
    minipar-OWNER-JOB-node1      eth0 (10.200.0.2/24), cabled to n1 ...

A node's hostname (node0, ...) is set when a process enters it (enter.py: a UTS namespace of
its own per launcher proxy), and the job's hosts file (node0 -> 10.200.0.1, ...) is bound over
/etc/hosts in a mount namespace of the proxy's own, so nothing outside the job sees either.
Each cable is shaped on both ends (eth0 out of the node, nK out of the switch) with link.py's
token bucket. Nothing is in
the machine's own namespace: no route, no address, so no byte can leave the job's switch.

Removing a namespace removes its interfaces and queues; the processes still inside a node are
killed first (a namespace with a process in it outlives its name).

Without root (rootless.py) the same commands run inside a user namespace of the job's own,
entered through its holder (`self.inside`), and down() ends the holder: the kernel kills what
ran inside and the namespaces go with it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time

from minipar.launcher.cluster import enter, rootless
from minipar.launcher.cluster import link as links
from minipar.launcher.cluster.mpi_args import slots

PREFIX = "minipar-"
NAME = re.compile(r"^minipar-(\d+)-([0-9a-f]+)-(node\d+|switch)$")
SUBNET = "10.200.0"  # private, and only inside this job's namespaces
MTU = 9000  # jumbo frames, as cluster networks use: less of the link spent on headers
NETNS_DIR = "/run/netns"
FILLS = ("block", "cyclic")  # consecutive ranks on a node (launchers' default), or dealt round


class EmulationError(RuntimeError):
    """The emulated cluster could not be made (what failed, and what to do instead)."""


def run_ip(args: list[str], what: str) -> str:
    """Run one `ip`/`tc` command; EmulationError naming it and its complaint when it fails."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise EmulationError(f"{what}: `{' '.join(args)}` failed: {error}") from None
    if done.returncode != 0:
        raise EmulationError(f"{what}: `{' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


class EmulatedCluster:
    """N emulated nodes on a switch, each cable shaped at `link` (tc's spelling)."""

    def __init__(
        self, n_nodes: int, link: str = links.DEFAULT, owner: int | None = None, fill="block"
    ):
        if not isinstance(n_nodes, int) or isinstance(n_nodes, bool) or not 1 <= n_nodes <= 64:
            raise ValueError(f"--nodes must be an integer from 1 to 64, got {n_nodes!r}")
        if fill not in FILLS:
            raise ValueError(f"--fill must be one of {', '.join(FILLS)}, got {fill!r}")
        self.n_nodes, self.fill = n_nodes, fill
        self.rate = links.parse(link)
        self.owner = os.getpid() if owner is None else owner
        self.job = secrets.token_hex(3)
        self.stem = f"{PREFIX}{self.owner}-{self.job}-"
        self.folder = None  # the stand-in for ssh lives here (mpi_args.py)
        self.made: list[str] = []  # namespaces made so far, removed in down()
        self.timings: dict[str, float] = {}
        self.holder = None  # rootless.Holder of the job's user namespace, without root

    def namespace(self, k: int) -> str:
        return f"{self.stem}node{k}"

    @property
    def switch(self) -> str:
        return f"{self.stem}switch"

    @property
    def hosts(self) -> list[str]:
        return [self.address(k) for k in range(self.n_nodes)]

    def address(self, k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    def hostname(self, k: int) -> str:
        return f"node{k}"

    def table(self) -> str:
        """address=namespace=hostname for every node, the stand-in's map (enter.py)."""
        return ",".join(
            f"{self.address(k)}={self.namespace(k)}={self.hostname(k)}" for k in range(self.n_nodes)
        )

    def ranks_on(self, n: int) -> list[list[int]]:
        """The ranks of a job of n on each node: in blocks, or dealt round (--fill cyclic)."""
        if self.fill == "cyclic":
            return [list(range(k, n, self.n_nodes)) for k in range(self.n_nodes)]
        counts = slots(n, self.n_nodes)
        return [list(range(sum(counts[:k]), sum(counts[: k + 1]))) for k in range(self.n_nodes)]

    def describe(self, n: int) -> str:
        """'node0 10.200.0.1 ranks 0-1, node1 10.200.0.2 ranks 2-3' for a job of n ranks
        ('ranks 0,2' where they are dealt round)."""
        parts = []
        for k, ranks in enumerate(self.ranks_on(n)):
            if len(ranks) == 1:
                said = f"rank {ranks[0]}"
            elif ranks[-1] - ranks[0] == len(ranks) - 1:
                said = f"ranks {ranks[0]}-{ranks[-1]}"
            else:
                said = "ranks " + ",".join(map(str, ranks))
            parts.append(f"{self.hostname(k)} {self.address(k)} {said}")
        return ", ".join(parts)

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()

    def up(self) -> None:
        """Make the switch, the nodes and their cables; on any failure remove what was made."""
        began = time.perf_counter()
        try:
            if rootless.wanted():
                self.holder = rootless.Holder.start()
            self._add_namespace(self.switch)
            self._ip(self.switch, "link", "add", "br0", "type", "bridge")
            self._ip(self.switch, "link", "set", "br0", "up")
            for k in range(self.n_nodes):
                self._add_node(k)
            self.folder = tempfile.mkdtemp(prefix=f"{self.stem}files-")
            self._write_hosts()
        except OSError as error:  # the holder could not start
            self.down()
            raise EmulationError(str(error)) from None
        except BaseException:
            self.down()
            raise
        self.timings["up"] = time.perf_counter() - began

    @property
    def hosts_file(self) -> str:
        """The nodes' /etc/hosts (enter.py binds it there on each node): node names resolve."""
        return os.path.join(self.folder or "", "hosts")

    def _write_hosts(self) -> None:
        lines = ["127.0.0.1 localhost"]
        lines += [f"{self.address(k)} {self.hostname(k)}" for k in range(self.n_nodes)]
        with open(self.hosts_file, "w") as f:
            f.write("\n".join(lines) + "\n")

    @property
    def inside(self) -> list[str]:
        """The words before a command that runs where the namespaces live (none, as root)."""
        return self.holder.inside if self.holder else []

    def on_node(self, k: int, argv: list[str]) -> list[str]:
        """A command line that runs argv, exactly as given, on node k (the launcher's)."""
        node = (self.namespace(k), self.hostname(k), self.hosts_file)
        return [*self.inside, *enter.argv_on_node(*node, argv)]

    def _add_namespace(self, name: str) -> None:
        run_ip([*self.inside, "ip", "netns", "add", name], "making an emulated node")
        self.made.append(name)

    def _add_node(self, k: int) -> None:
        node, port = self.namespace(k), f"n{k}"
        self._add_namespace(node)
        self._ip(self.switch, "link", "add", port, "mtu", str(MTU), "type", "veth",
                 "peer", "name", "eth0", "netns", node)  # fmt: skip
        self._ip(self.switch, "link", "set", port, "master", "br0", "up")
        self._ip(node, "addr", "add", f"{self.address(k)}/24", "dev", "eth0")
        # `mtu` in `link add ... type veth peer ...` sets the switch's end only: the node's too
        self._ip(node, "link", "set", "eth0", "mtu", str(MTU), "up")
        self._ip(node, "link", "set", "lo", "up")
        shape = links.tbf(self.rate)
        if shape is not None:  # both directions: out of the node, and out of the switch to it
            self._tc(node, "eth0", shape)
            self._tc(self.switch, port, shape)

    def _ip(self, namespace: str, *args: str) -> None:
        run_ip([*self.inside, "ip", "-n", namespace, *args], f"cabling {namespace}")

    def _tc(self, namespace: str, dev: str, shape: list[str]) -> None:
        run_ip([*self.inside, "tc", "-n", namespace, "qdisc", "add", "dev", dev, "root", *shape],
               f"shaping the link on {namespace} {dev} (tc's tbf)")  # fmt: skip

    def down(self) -> None:
        """Kill what still runs inside the nodes, remove every namespace and the folder."""
        began = time.perf_counter()
        if self.holder is not None:  # its PID 1 ends: all inside killed, the namespaces gone
            self.holder.stop()
            self.holder, self.made = None, []
        for name in reversed(self.made):
            remove_namespace(name)
        self.made = []
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        self.timings["down"] = time.perf_counter() - began


def remove_namespace(name: str) -> None:
    """SIGKILL the processes inside the namespace, then delete it (quiet if already gone)."""
    for _ in range(50):  # a process may fork while we kill: look again until none is left
        pids = _pids_in(name)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30, check=False)


def _pids_in(name: str) -> list[int]:
    try:
        done = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(p) for p in done.stdout.split() if p.isdigit() and int(p) != os.getpid()]


def namespaces() -> list[str]:
    """Every minipar namespace on this machine (any owner, any job)."""
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        return []
    return sorted(n for n in names if NAME.match(n))
