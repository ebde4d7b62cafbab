"""A cluster that stays up (minipar cluster up|shell|status|down; launcher/cluster/standing.py).

- up, then from node0's shell plain `mpiexec -hosts node0:2,node1:2 -n 4 python x.py` (the
  node map right, 1 MiB all-reduced across the cable) and `ssh node1 hostname`; status shows
  the bytes each cable carried; down; nothing left: namespaces, links, queues, processes, files;
- a keeper killed (SIGKILL): the next `minipar cluster status` finds nothing up and has swept
  what it left;
- the refusals, before anything starts: bad arguments, a second cluster, an unknown node.
Each test gives the commands a temporary directory of its own (TMPDIR), so a cluster the user
keeps up is never seen or touched. MINIPAR_EXTENDED=1 (CI's cluster step) adds 20 up/down
cycles, each counted.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import ROOT

from minipar.launcher.cluster import leftovers, needs
from minipar.launcher.cluster.nodes import namespaces

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
WHERE = os.path.join(ROOT, "tests", "scripts", "nodes_where.py")
WHY_NOT = "; ".join(needs.missing())
emulation = pytest.mark.skipif(bool(WHY_NOT), reason=f"no emulated nodes here: {WHY_NOT}")
FOUR_ON_TWO = [(0, 0, 0, 2, "node0"), (1, 0, 1, 2, "node0"), (2, 1, 0, 2, "node1"),
               (3, 1, 1, 2, "node1")]  # fmt: skip


class Commands:
    """`python -m minipar cluster ...` with a TMPDIR of its own and a mark in the environment
    that every process the cluster starts inherits (so they can be counted)."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="mp-")  # short: Unix sockets live under it
        self.mark = f"MINIPAR_TEST_MARK={os.getpid()}-{time.monotonic_ns()}"
        self.env = dict(os.environ, TMPDIR=self.tmp, OMP_NUM_THREADS="1", MINIPAR_TIMEOUT="20",
                        MINIPAR_TEST_MARK=self.mark.split("=", 1)[1])  # fmt: skip

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "minipar", "cluster", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=self.env, cwd=self.tmp)  # fmt: skip

    def ok(self, *args: str, timeout: float = 120) -> str:
        done = self(*args, timeout=timeout)
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
        return done.stdout + done.stderr

    def processes(self) -> list[int]:
        """The processes that carry the mark: the keeper, its holder, daemons, ranks."""
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if self.mark.encode() in f.read().split(b"\0"):
                        found.append(int(pid))
            except OSError:
                pass
        return found

    def files(self) -> list[str]:
        return os.listdir(self.tmp)

    def close(self) -> None:
        self("down", timeout=60)
        for pid in self.processes():  # a failed test's cluster must not outlive it
            os.kill(pid, signal.SIGKILL)
        leftovers.sweep()
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def cluster_cli():
    commands = Commands()
    try:
        yield commands
    finally:
        commands.close()


def machine() -> dict:
    """The machine's own links and queues (a cluster adds none there) and minipar's namespaces."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    qdiscs = subprocess.run(["tc", "qdisc"], capture_output=True, text=True).stdout
    return {"links": len(links.splitlines()), "qdiscs": len(qdiscs.splitlines())}


def where(out: str) -> list[tuple]:
    rows = [line.split()[1:] for line in out.splitlines() if line.startswith("WHERE")]
    return sorted((int(r), int(n), int(lr), int(nn), h) for r, n, lr, nn, h in rows)


def keeper_of(out: str) -> int:
    """The keeper's pid, from `minipar cluster status`."""
    return int(out.split("keeper pid ")[1].split(")")[0])


def nothing_left(cli: Commands, keeper: int, before: dict) -> None:
    """Not a namespace, link, queue, process or file of the cluster's is left."""
    time.sleep(0.1)
    assert [n for n in namespaces() if n.startswith(f"minipar-{keeper}-")] == []
    assert cli.processes() == [], "processes of the cluster outlived it"
    assert cli.files() == [], cli.files()
    assert machine() == before


# -- the refusals --------------------------------------------------------------------------------
def test_bad_arguments_are_named_before_anything_starts(cluster_cli):
    cases = [
        (("up", "--nodes", "0"), "--nodes must be an integer from 1 to 64, got 0"),
        (("up", "--nodes", "2", "--link", "fast"), "'fast'"),
        (("shell", "node0"), "no cluster is up: minipar cluster up --nodes 2"),
    ]
    for args, said in cases:
        done = cluster_cli(*args, timeout=60)
        assert done.returncode == 2, done.stdout + done.stderr
        assert said in " ".join(done.stderr.split()), done.stderr
    status = cluster_cli("status", timeout=60)
    assert status.returncode == 1 and "no cluster is up" in status.stdout
    assert cluster_cli.files() == [] and cluster_cli.processes() == []


# -- up, used, down ------------------------------------------------------------------------------
@emulation
def test_a_standing_cluster_from_up_to_down(cluster_cli):
    before = machine()
    cluster_cli.ok("up", "--nodes", "2")
    again = cluster_cli("up", "--nodes", "2")
    assert again.returncode == 2 and "a cluster is up already" in again.stderr, again.stderr
    mpiexec = f"mpiexec -hosts node0:2,node1:2 -n 4 {sys.executable} {WHERE}"
    out = cluster_cli.ok("shell", "node0", "--", "sh", "-c", f"{mpiexec} && ssh node1 hostname")
    assert where(out) == FOUR_ON_TWO, out
    assert "\nnode1\n" in out, out  # ssh node1 hostname, through the stand-in
    unknown = cluster_cli("shell", "node9", "--", "true")
    assert unknown.returncode == 2 and "no node 'node9'" in unknown.stderr
    assert "node0, node1" in unknown.stderr
    status = cluster_cli.ok("status")
    for k in range(2):  # an all-reduce of 1 MiB between two nodes: each receives >= 1 MiB
        line = next(x for x in status.splitlines() if x.strip().startswith(f"node{k}"))
        received = int(line.split("B sent, ")[1].split(" B received")[0].replace(",", ""))
        assert received >= 1 << 20, line
    keeper = keeper_of(status)
    cluster_cli.ok("down")
    nothing_left(cluster_cli, keeper, before)


@emulation
def test_a_killed_keeper_is_swept(cluster_cli):
    before = machine()
    cluster_cli.ok("up", "--nodes", "2")
    keeper = keeper_of(cluster_cli.ok("status"))
    os.kill(keeper, signal.SIGKILL)  # nothing of minipar's runs its clean-up
    time.sleep(0.2)
    status = cluster_cli("status")
    assert status.returncode == 1 and "no cluster is up" in status.stdout, status.stdout
    nothing_left(cluster_cli, keeper, before)


@emulation
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
@pytest.mark.parametrize("way", ["as_is", "rootless"])
def test_twenty_up_down_cycles_leave_nothing(cluster_cli, way):
    """As this user is (root: namespaces named in /run/netns), and the rootless way."""
    if way == "rootless":
        cluster_cli.env["MINIPAR_ROOTLESS"] = "1"
    before = machine()
    for _ in range(20):
        cluster_cli.ok("up", "--nodes", "2")
        keeper = keeper_of(cluster_cli.ok("status"))
        cluster_cli.ok("down")
        nothing_left(cluster_cli, keeper, before)


# -- a node's shell: the environment it came from; the cables at MTU 9000 at both ends ---------
def test_a_nodes_interactive_shell_reads_no_rc_file(monkeypatch, tmp_path):
    """The shell a standing cluster gives (no command): bash without ~/.bashrc or a profile,
    the prompt naming the node, this Python's folder first on PATH after the ssh stand-in."""
    from minipar.launcher.cluster import standing

    state = {"nodes": [{"namespace": "ns0", "hostname": "node0", "address": "10.0.0.1"}],
             "hosts_file": "", "holder": None, "bin": "/stand-in", "env": {}}  # fmt: skip
    monkeypatch.setenv("SHELL", "/bin/bash")
    monkeypatch.setenv("ENV", str(tmp_path / ".shrc"))
    cmd, env = standing.shell_command(state, "node0", [])
    assert cmd[-4:] == ["/bin/bash", "--noprofile", "--norc", "-i"], cmd
    assert env["PATH"].split(os.pathsep)[:2] == ["/stand-in", os.path.dirname(sys.executable)]
    assert env["PS1"].startswith("[node0] ") and "ENV" not in env
    cmd, _ = standing.shell_command(state, "node0", ["hostname"])
    assert cmd[-1] == "hostname"  # a command is run as given


@emulation
def test_a_nodes_shell_runs_this_python_whatever_bashrc_says(cluster_cli, tmp_path):
    """A HOME whose .bashrc puts a python of its own first (as pyenv's or conda's lines do):
    `command -v python` in the node's interactive shell is still this Python's."""
    home = tmp_path / "home"
    (home / "fakebin").mkdir(parents=True)
    fake = home / "fakebin" / "python"
    fake.write_text("#!/bin/sh\necho not the job's python\n")
    fake.chmod(0o755)
    (home / ".bashrc").write_text(f'export PATH="{home / "fakebin"}:$PATH"\n')
    (home / ".bash_profile").write_text(f'. "{home / ".bashrc"}"\n')
    cluster_cli.env.update(HOME=str(home), SHELL="/bin/bash")
    cluster_cli.ok("up", "--nodes", "2")
    cmd = [sys.executable, "-m", "minipar", "cluster", "shell", "node0"]
    typed = "command -v python\nhostname\nexit\n"
    done = subprocess.run(cmd, input=typed, capture_output=True, text=True, timeout=60,
                          env=cluster_cli.env, cwd=cluster_cli.tmp)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.split()
    assert os.path.join(os.path.dirname(sys.executable), "python") in lines, done.stdout
    assert str(fake) not in done.stdout and "node0" in lines, done.stdout


@emulation
def test_every_cable_is_at_mtu_9000_at_both_ends(cluster_cli):
    """docs/cluster.md: the cables run at MTU 9000; `mtu` in `ip link add ... type veth peer`
    set only the switch's end, and each node's eth0 stayed at 1500."""
    from minipar.launcher.cluster.nodes import MTU

    cluster_cli.ok("up", "--nodes", "2")
    for k in range(2):  # ip, not /sys/class/net: the shell's /sys is the machine's
        shown = cluster_cli.ok("shell", f"node{k}", "--", "ip", "-o", "link", "show", "eth0")
        assert f" mtu {MTU} " in shown and MTU == 9000, shown
