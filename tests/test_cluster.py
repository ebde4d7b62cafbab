"""A cluster on one machine (minipar run --nodes; minipar/launcher/cluster/, docs/cluster.md).

- the parts on their own: link rates, ranks per node, the stand-in for ssh, each MPI's launcher
  arguments, the refusal when the machine lacks what emulation needs, the owner check;
- on emulated nodes (root, ip, tc, namespaces; skipped with the reason where they cannot be
  made): every rank knows its node, the bytes between nodes cross the shaped link and match the
  ledger, those inside a node do not, every collective gives the bits it gives on one node, a
  wait across nodes keeps the link moving (a 1 MiB exchange near the wire's time);
- nothing left behind after every ending (success, a failing rank, Ctrl-C, SIGTERM, SIGKILL of
  `minipar run` and the next job's sweep; the five jobs at once), counted: namespaces, links,
  queues, folders (found by this file's own pattern, not the sweep's);
- the faults only a cluster has: a cable pulled mid-job, a whole node killed (both jobs at once);
- minipar.launch from this process on 3 nodes of 2 (a node's size is not the number of nodes):
  every rank's host, node, local rank and node size against a table written here, and `auto`
  taking the two-level all-reduce across a slow link.
MINIPAR_EXTENDED=1 (CI's cluster step) adds the collectives matrix on 2x2, 2x3 and 4x1 nodes,
uneven nodes, the strategies' suites (DDP, FSDP, TP, PP, CP, EP, the mesh) on 2x2, 20 jobs of
every ending, 3D training with --check across 2 nodes, the launch on 2 nodes of 3 and on
3 + 2 ranks, and training restarted on the nodes left (dp 3 x tp 2; hybrid sharding 2 x 2).
"""

import functools
import glob
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ranks_suite
from emulated import emulation

from minipar.launcher.cluster import enter, leftovers, link, mpi_args, needs
from minipar.launcher.cluster.nodes import EmulatedCluster, namespaces
from minipar.testing import harness

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
SUITE = ranks_suite("cluster.py")
MATRIX = ranks_suite("collectives.py")
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


# -- the parts on their own ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,bits",
    [("2gbit", 2e9), ("500mbit", 5e8), ("1.5gbit", 1.5e9), ("unlimited", None)],
)
def test_link_rates(text, bits):
    assert link.parse(text) == bits


@pytest.mark.parametrize("bad", ["fast", "2gb", "-1gbit", "0mbit", "", "2 gigabit"])
def test_bad_link_rate_is_named(bad):
    with pytest.raises(ValueError, match="--link") as info:
        link.parse(bad)
    assert repr(bad) in str(info.value)


def test_token_bucket_holds_a_millisecond_and_a_tso_packet():
    assert link.bucket_bytes(2e9) == 250_000  # 1 ms at 250 MB/s
    assert link.bucket_bytes(1e8) == 64 * 1024  # never below one 64 KiB TSO packet
    assert link.tbf(None) is None
    assert link.tbf(2e9)[:3] == ["tbf", "rate", "2000000000bit"]


def test_ranks_fill_nodes_in_blocks():
    assert mpi_args.slots(4, 2) == [2, 2]
    assert mpi_args.slots(5, 2) == [3, 2]
    assert mpi_args.slots(7, 3) == [3, 2, 2]
    with pytest.raises(ValueError, match="-n 2 ranks cannot fill --nodes 3"):
        mpi_args.slots(2, 3)


def test_stand_in_maps_hosts_to_namespaces():
    table = "10.200.0.1=ns-a=node0,10.200.0.2=ns-b=node1"
    assert enter.lookup("10.200.0.2", table) == ("ns-b", "node1")
    assert enter.lookup("node0", table) == ("ns-a", "node0")
    with pytest.raises(ValueError, match=r"'10.200.0.9'.*10.200.0.1, 10.200.0.2"):
        enter.lookup("10.200.0.9", table)
    ssh = enter.words_on_node("ns-b", "node1", "/h", ["PATH=/x;export", "PATH;", "prted", "--a"])
    assert ssh[:3] == ["nsenter", "--net=/run/netns/ns-b", "--"]
    assert ssh[-1] == (  # ssh joins the words; the node's hosts file, /dev/shm, name
        f"mount --bind /h /etc/hosts && {enter.SHM_MOUNT} && hostname node1 && "
        "PATH=/x;export PATH; prted --a"
    )
    exact = enter.argv_on_node("ns-a", "node0", "/h", ["mpiexec", "a b", "$HOME"])
    assert exact[-3:] == ["mpiexec", "a b", "$HOME"]  # the launcher's argv kept exact


def test_stand_in_refuses_an_unknown_host(monkeypatch, capsys):
    monkeypatch.setenv(enter.TABLE_ENV, "10.200.0.1=ns-a=node0")
    assert enter.main(["-x", "10.9.9.9", "true"]) == 255
    assert "10.9.9.9" in capsys.readouterr().err


class _Cluster:  # enough of an EmulatedCluster for the launcher's arguments
    n_nodes, hosts, hosts_file, fill = 2, ["10.200.0.1", "10.200.0.2"], "/h", "block"

    def __init__(self, folder):
        self.folder = folder

    def table(self):
        return "10.200.0.1=a=node0,10.200.0.2=b=node1"


@pytest.mark.parametrize("flavor", ["mpich", "openmpi"])
def test_each_launcher_is_told_the_nodes_and_the_transport(flavor, tmp_path):
    args, env = mpi_args.for_cluster(flavor, _Cluster(str(tmp_path)), 5)
    hosts = "10.200.0.1:3,10.200.0.2:2"
    agent = str(tmp_path / "enter")
    assert os.access(agent, os.X_OK)
    assert env[enter.TABLE_ENV] == "10.200.0.1=a=node0,10.200.0.2=b=node1"
    if flavor == "mpich":  # UCX (or OFI) over TCP on eth0: not /dev/shm, which nodes share here
        assert args == ["-launcher", "ssh", "-launcher-exec", agent, "-hosts", hosts]
        assert env["UCX_TLS"] == "tcp,self" and env["UCX_NET_DEVICES"] == "eth0"
        assert env["FI_PROVIDER"] == "tcp"
    else:
        joined = " ".join(args)
        assert f"--host {hosts}" in joined and f"plm_ssh_agent {agent}" in joined
        assert "--mca btl self,sm,tcp" in joined and "btl_tcp_if_include eth0" in joined


@pytest.mark.parametrize("flavor", ["mpich", "openmpi"])
def test_ranks_dealt_round_the_nodes(flavor, tmp_path):
    cluster = _Cluster(str(tmp_path))
    cluster.fill = "cyclic"
    args, _ = mpi_args.for_cluster(flavor, cluster, 4)
    joined = " ".join(args)
    if flavor == "mpich":  # one slot a host: hydra wraps round them
        assert "-hosts 10.200.0.1:1,10.200.0.2:1" in joined
    else:
        assert "--map-by node" in joined
    made = EmulatedCluster(2, "unlimited", fill="cyclic")  # nothing made until up()
    assert made.ranks_on(5) == [[0, 2, 4], [1, 3]]
    assert made.describe(4) == "node0 10.200.0.1 ranks 0,2, node1 10.200.0.2 ranks 1,3"
    assert EmulatedCluster(2).ranks_on(5) == [[0, 1, 2], [3, 4]]
    with pytest.raises(ValueError, match="--fill must be one of block, cyclic, got 'round'"):
        EmulatedCluster(2, fill="round")


def test_real_hosts_pass_through(tmp_path):
    assert mpi_args.for_hosts("mpich", "a:8,b:8", None) == ["-hosts", "a:8,b:8"]
    assert mpi_args.for_hosts("openmpi", "a:8,b:8", None) == ["--host", "a:8,b:8"]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a:8\n")
    assert mpi_args.for_hosts("mpich", None, str(hostfile)) == ["-f", str(hostfile)]
    assert mpi_args.for_hosts("openmpi", None, str(hostfile)) == ["--hostfile", str(hostfile)]
    with pytest.raises(ValueError, match="no such file"):
        mpi_args.for_hosts("mpich", None, str(tmp_path / "none"))


def _ours() -> list[str]:
    """The namespaces this process made (minipar-PID-...) and did not remove."""
    return [n for n in namespaces() if n.startswith(f"minipar-{os.getpid()}-")]


def test_a_machine_without_what_emulation_needs_is_refused_first(monkeypatch, capsys):
    from minipar import cli

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    real_which = needs.shutil.which
    monkeypatch.setattr(needs.shutil, "which", lambda t: None if t == "tc" else real_which(t))
    status = cli.main(["run", "--nodes", "2", "-n", "4", os.path.join(SCRIPTS, "nodes_ok.py")])
    said = capsys.readouterr().err
    assert status == 2
    assert "root" in said and "`tc`" in said and "(no --nodes)" in said
    assert _ours() == []  # nothing was made (other jobs on this machine may make theirs)


def test_bad_cluster_arguments_are_named(capsys):
    from minipar import cli

    script = os.path.join(SCRIPTS, "nodes_ok.py")
    assert cli.main(["run", "--nodes", "3", "-n", "2", script]) == 2
    assert "-n 2 ranks cannot fill --nodes 3" in capsys.readouterr().err
    assert cli.main(["run", "--nodes", "0", "-n", "2", script]) == 2
    assert "--nodes must be an integer from 1 to 64, got 0" in capsys.readouterr().err
    assert cli.main(["run", "-n", "2", "--link", "1gbit", script]) == 2
    assert "give --nodes N too" in capsys.readouterr().err


def test_a_wait_knows_which_peers_are_across_the_link(monkeypatch):
    """Group ranks are translated to world ranks before the node map is read: in the group of
    world ranks [1, 2, 3] (nodes 0, 1, 1), group rank 0 is across the link from group rank 1."""
    from types import SimpleNamespace

    from minipar.comm.transport.base import Request, crosses_nodes
    from minipar.runtime.nodes import NodeMap
    from minipar.state import process

    monkeypatch.setattr(process, "nodes", NodeMap((0, 0, 1, 1), ("node0", "node1"), "test"))
    group = SimpleNamespace(global_ranks=[1, 2, 3], rank=1)  # world rank 2, on node1

    def waiting_for(*peers):
        return [Request(group, "recv", peer, 0, 8) for peer in peers]

    assert crosses_nodes(waiting_for(0))  # world rank 1, node0
    assert not crosses_nodes(waiting_for(2))  # world rank 3, node1
    assert crosses_nodes(waiting_for(2, 0))
    assert not crosses_nodes(waiting_for(-1))  # any source, or a barrier: no one peer
    monkeypatch.setattr(process, "nodes", NodeMap((0, 0, 0, 0), ("node0",), "test"))
    assert not crosses_nodes(waiting_for(0))


def test_a_dead_owner_is_told_from_a_live_one():
    now = time.time()
    assert leftovers.owner_alive(os.getpid(), now)
    assert not leftovers.owner_alive(os.getpid(), now - 10 * 24 * 3600)  # pid reused since
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not leftovers.owner_alive(child.pid, now)


# -- on emulated nodes ---------------------------------------------------------------------------
@emulation
@pytest.mark.parametrize("name", harness.case_names(SUITE, 4))
def test_on_two_nodes(name):
    harness.run_suite(SUITE, 4, "mpi", nodes=2).check(name)


def _digests(result) -> dict:
    lines = result.ranks[0]["digest"]["output"].splitlines()
    return dict(line.split()[1:] for line in lines if line.startswith("DIGEST"))


@emulation
def test_every_collective_gives_the_same_bits_as_on_one_node():
    across = harness.run_suite(SUITE, 4, "mpi", nodes=2)
    alone = harness.run_suite(SUITE, 4, "mpi")
    across.check("digest")
    alone.check("digest")
    assert len(_digests(alone)) >= 15
    assert _digests(across) == _digests(alone)


def _exchanges(result) -> dict:
    """Each way's round trips (seconds) from the exchange_across case's output."""
    lines = result.ranks[0]["exchange_across"]["output"].splitlines()
    words = [line.split() for line in lines if line.startswith("EXCHANGE ")]
    return {w[1]: sorted(float(t) for t in w[2:]) for w in words}


@emulation
def test_a_wait_across_nodes_keeps_the_link_moving():
    """Issue 62: 2 nodes x 2 ranks, ranks outnumbering cores (MINIPAR_OVERSUBSCRIBED=1, so
    waits inside a node nap), a 1 MiB ping-pong across the 2 Gbit/s link (run_suite's): the
    median round trip within 2x the larger of the wire's (2 x 1 MiB / rate = 8.4 ms) and raw
    mpi4py's on the same ranks in turns. Waits that napped between polls took 2.4-5x the wire:
    the MPI's TCP transport moves bytes only while it is polled."""
    result = harness.run_suite(SUITE, 4, "mpi", nodes=2)
    result.check("exchange_across")
    times = _exchanges(result)
    wire = 2 * (1 << 20) * 8 / link.parse("2gbit")  # the link run_suite gives its nodes
    mine, raw = statistics.median(times["minipar"]), statistics.median(times["raw"])
    bound = 2 * max(wire, raw)
    assert mine <= bound, (
        f"1 MiB round trip across nodes: minipar {mine * 1e3:.1f} ms, raw mpi4py "
        f"{raw * 1e3:.1f} ms, wire {wire * 1e3:.1f} ms (bound {bound * 1e3:.1f} ms): {times}"
    )


@emulation
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
@pytest.mark.parametrize("size,nodes", [(3, 2), (5, 2)])
def test_uneven_nodes(size, nodes):
    result = harness.run_suite(SUITE, size, "mpi", nodes=nodes)
    for name in ("facts", "link_bytes", "inside_node", "digest"):
        result.check(name)


@emulation
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
@pytest.mark.parametrize("size,nodes", [(4, 2), (6, 2), (4, 4)])
def test_collectives_matrix_across_nodes(size, nodes):
    result = harness.run_suite(MATRIX, size, "mpi", nodes=nodes)
    for name in harness.case_names(MATRIX, size):
        result.check(name)


STRATEGIES = ["data_parallel.py", "tensor_parallel.py", "pipeline.py", "context.py", "expert.py",
              "mesh.py"]  # fmt: skip


@emulation
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
@pytest.mark.parametrize("suite", STRATEGIES)
def test_strategies_across_two_nodes(suite):
    """DDP, ZeRO, FSDP, TP, PP, CP, EP and the mesh's suites on 2 nodes x 2 ranks."""
    path = ranks_suite(suite)
    result = harness.run_suite(path, 4, "mpi", nodes=2)
    for name in harness.case_names(path, 4):
        result.check(name)


# -- nothing left behind -------------------------------------------------------------------------
def _machine() -> dict:
    """The machine's own links and queues (a job adds none: its links live in its namespaces)."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    qdiscs = subprocess.run(["tc", "qdisc"], capture_output=True, text=True).stdout
    return {"links": len(links.splitlines()), "qdiscs": len(qdiscs.splitlines())}


def _left_by(owner: int) -> list[str]:
    """What the job whose `minipar run` had pid `owner` left: namespaces (their links and
    queues with them), its nodes' folder, its ranks' pipes, its Open MPI session folders. Other
    jobs' are not counted: they may run beside this test. The folders by a pattern of this
    test's own (relay.py's minipar-io-PID-*, mpiexec.py's minipar-mpi-PID-*, the nodes'
    minipar-PID-JOB-files-*), not the sweep's."""
    ours = re.compile(rf"^minipar-(io-|mpi-)?{owner}-")
    mine = [n for n in os.listdir(tempfile.gettempdir()) if ours.match(n)]
    return [n for n in namespaces() if n.startswith(f"minipar-{owner}-")] + mine


def _job(script: str, *args: str, timeout: float = 60) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "minipar", "run", "--nodes", "2", "-n", "2",
           os.path.join(SCRIPTS, script), *args]  # fmt: skip
    env = dict(os.environ, MINIPAR_TIMEOUT="5", OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip


def _finish(proc, limit: float = 90) -> str:
    """The job's whole output once it ended; past `limit` seconds it is killed (SIGTERM to
    `minipar run`, which removes its nodes) and the test fails: a fault must never hang."""
    try:
        return proc.communicate(timeout=limit)[0]
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=30)[0]
        raise AssertionError(f"the job did not end within {limit} s:\n{out[-3000:]}") from None


def _wait_for(proc, text: str, limit: float = 30) -> str:
    """Read the job's output until `text` appears (the ranks are up and on their nodes)."""
    seen, end = "", time.monotonic() + limit
    while text not in seen and time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    assert text in seen, seen
    return seen


def _ending(kind: str) -> int:
    """One job that ends as `kind` says; the pid of its `minipar run`."""
    if kind == "ok":
        proc = _job("nodes_ok.py")
        out = _finish(proc, 60)
        assert proc.returncode == 0, out
        return proc.pid
    if kind == "rank_fails":
        proc = _job("nodes_ok.py", "fail")
        out = _finish(proc, 60)
        assert proc.returncode != 0 and "rank 1 fails on purpose" in out, out
        return proc.pid
    proc = _job("nodes_ok.py", "wait")
    _wait_for(proc, "ranks ready")
    sig = {"ctrl_c": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}[kind]
    os.kill(proc.pid, sig)  # `minipar run` itself, as a user's Ctrl-C or a scheduler would
    out = _finish(proc, 60)
    assert proc.returncode != 0, out
    if kind == "sigkill":  # nothing ran minipar's clean-up: the launcher and ranks live on
        assert _left_by(proc.pid), "a SIGKILLed job's namespaces should be there to sweep"
        leftovers.sweep()  # what the next `minipar run --nodes` (or minipar doctor) does
    return proc.pid


ENDINGS = ["ok", "rank_fails", "ctrl_c", "sigterm", "sigkill"]


def _named_ending(kind: str) -> int:
    try:
        return _ending(kind)
    except AssertionError as error:
        raise AssertionError(f"ending {kind}: {error}") from None


@emulation
def test_nothing_is_left_behind():
    """The five endings at once, one job each on nodes of its own (mostly waiting: start-ups,
    signals, clean-ups; at once they take about what one takes alone), and none leaves
    anything, nor touches another job's."""
    before, sessions = _machine(), _sessions()
    with ThreadPoolExecutor(len(ENDINGS)) as pool:
        for _ in range(20 if EXTENDED else 1):
            owners = dict(zip(ENDINGS, pool.map(_named_ending, ENDINGS)))
            for kind, owner in owners.items():
                assert _left_by(owner) == [], kind
    assert _machine() == before
    left = _dead_sessions(_sessions() - sessions)
    assert left == set(), f"Open MPI's session folders left in TMPDIR: {left}"


def _sessions() -> set[str]:
    """Open MPI's session folders in the temporary directory: ompi.PID of its launcher,
    prted.PID of a daemon (each removes its own as it ends, unless it is killed)."""
    tmp = tempfile.gettempdir()
    return set(glob.glob(os.path.join(tmp, "ompi.*")) + glob.glob(os.path.join(tmp, "prted.*")))


def _dead_sessions(found: set[str], wait: float = 10.0) -> set[str]:
    """Those of `found` still there once their process is gone (waiting up to `wait` s for a
    launcher that is still ending): what a killed node's or job's left. A live one's (a warm
    job of the test pool beside this test) is not counted."""

    def alive(path: str) -> bool:
        try:
            with open(f"/proc/{path.rsplit('.', 1)[1]}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    deadline = time.monotonic() + wait
    while any(alive(p) for p in found) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {p for p in found if os.path.exists(p) and not alive(p)}


@emulation
def test_each_node_has_a_dev_shm_of_its_own_and_a_stopped_job_leaves_nothing():
    """Each node's ranks share a /dev/shm (a tmpfs) that is neither the machine's nor the other
    node's, as real nodes' memories are: no job's MPICH names can meet another's, whoever runs
    it (two users' rootless jobs computed the same ones). SIGTERM to `minipar run`: hydra's
    topology files gone from the machine's /tmp, and nothing of the job in its /dev/shm."""
    from minipar.launcher.mpiexec import mpi_flavor

    proc = _job("job_files.py", "wait")
    seen = _wait_for(proc, "ranks ready")
    while seen.count("MADE ") < 2:  # a launcher may forward the ranks' lines in any order
        seen += _wait_for(proc, "MADE ", 20)
    made = [line.split() for line in seen.splitlines() if line.startswith("MADE")]
    devices = {int(words[1]): int(words[3]) for words in made}  # rank -> its /dev/shm
    assert len(devices) == 2 and os.stat("/dev/shm").st_dev not in devices.values(), seen
    assert devices[0] != devices[1], seen  # one rank a node: two tmpfs
    files = {path for words in made for path in words[4:]}
    topology = {p for p in files if p.startswith("/tmp/")}
    hydra = mpi_flavor() == "mpich"  # hydra's topology file: MPICH's launcher only
    assert (topology or not hydra) and all(os.path.exists(p) for p in topology), seen
    os.kill(proc.pid, signal.SIGTERM)
    out = _finish(proc, 60)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert [p for p in files if os.path.exists(p)] == [], out
    assert _left_by(proc.pid) == [], out


# -- faults only a cluster has ------------------------------------------------------------------
FAULTS = ("link_down", "node_killed")


@functools.cache
def _faults() -> dict:
    """Both fault jobs, run at once (each on nodes of its own; the pulled cable's mostly waits
    out its timeout): mode -> (its whole output, how long it took, its exit status)."""

    def one(mode):
        start = time.monotonic()
        proc = _job("nodes_faults.py", mode)
        out = _finish(proc)
        return out, time.monotonic() - start, proc.returncode

    with ThreadPoolExecutor(len(FAULTS)) as pool:
        return dict(zip(FAULTS, pool.map(one, FAULTS)))


def _fault(mode: str) -> tuple[str, float]:
    """A fault job's whole output and how long it took; it must fail."""
    out, took, returncode = _faults()[mode]
    assert returncode != 0, out
    return out, took


@emulation
def test_a_pulled_cable_is_named_within_the_timeout():
    out, took = _fault("link_down")
    assert "pulled node0's cable" in out, out
    for rank in range(2):  # every rank names what it lost, and that it is across the link
        assert f"[rank {rank}]" in out and "CommTimeoutError" in out, out
    assert "across the link from node0" in out and "across the link from node1" in out, out
    assert took < 30, took  # MINIPAR_TIMEOUT=5, and a start-up


@emulation
def test_a_killed_node_ends_the_job_at_once_and_is_named():
    out, took = _fault("node_killed")
    account = out.split("minipar run: the emulated nodes were")[0]
    assert "node1" in account, out  # the launcher's own account names it (or its address)
    assert "node1 10.200.0.2 rank 1" in out, out
    assert took < 5 + 10, took  # before any timeout (5 s) could have ended it


@emulation
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
@pytest.mark.parametrize(
    "lesson,passed",
    [
        ("01", "the link between nodes is the slower one at 16 MiB"),
        ("04", "the two-level all-reduce beats the flat ring across nodes"),
        ("05", "hybrid sharding beats full sharding across the link"),
        ("08", "tp across nodes is slower"),
        ("09", "longer sequences hide more of the K/V messages"),
    ],
)
def test_lessons_measure_the_link_between_nodes(lesson, passed, tmp_path):
    """The claim about the link is made and not failed: PASS on a quiet machine, NOT JUDGED on
    a busy one (a timing claim; lessons/README.md), and the link's rate is printed."""
    out = tmp_path / "claims.json"
    cmd = [sys.executable, "-m", "minipar", "lesson", lesson, "--quick", "--nodes", "2",
           "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200"))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 Gbit/s" in done.stdout, done.stdout[-3000:]
    made = [c for c in json.loads(out.read_text())["claims"] if c["claim"].startswith(passed)]
    assert made and all(c["verdict"] in ("within", "not judged") for c in made), made


@emulation
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
def test_3d_training_checks_across_two_nodes():
    cmd = [sys.executable, "-m", "minipar", "run", "--nodes", "2", "-n", "8", "--timeout", "600",
           sys.executable, "-m", "minipar", "train", "--dp", "2", "--tp", "2", "--pp", "2",
           "--steps", "3", "--layers", "4", "--check"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=660,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _where():
    import socket

    import numpy as np

    import minipar
    from minipar import cost
    from minipar.collectives import hierarchical
    from minipar.runtime.devices import local_rank_from_env

    x = np.ones(1 << 20, np.float32)  # 4 MiB
    cost.set_inter_link(cost.Link("slow", 50e-6, 1 / 0.25e9, 1 / 5e9))  # 2 Gbit/s
    with minipar.trace() as t:
        minipar.all_reduce(x, algorithm="auto")
    said = local_rank_from_env(os.environ)
    return (
        minipar.get_rank(),
        socket.gethostname(),
        minipar.node_rank(),
        minipar.local_rank(),
        minipar.local_world_size(),
        said and said[0],
        hierarchical.shape(minipar.runtime.world.default_group()),
        t.calls[-1].algorithm,
        float(x[0]),
    )


# rank -> node, written out: consecutive ranks fill the nodes in blocks, the first ones larger
PLACES = {(6, 3): [0, 0, 1, 1, 2, 2], (6, 2): [0, 0, 0, 1, 1, 1], (5, 2): [0, 0, 0, 1, 1]}


def _check_places(n: int, nodes: int):
    """minipar.launch from this process (as from a notebook) on emulated nodes: every rank's
    place against PLACES, and the nodes gone once it returns."""
    import minipar

    got = minipar.launch(_where, n=n, nodes=nodes, timeout=120)
    assert _ours() == []
    node_of = PLACES[(n, nodes)]
    sizes = [node_of.count(k) for k in range(nodes)]
    even = len(set(sizes)) == 1
    for rank, row in enumerate(got):
        node = node_of[rank]
        local = node_of[:rank].count(node)
        shape = (nodes, sizes[0]) if even else None
        assert row[:7] == (rank, f"node{node}", node, local, sizes[node], local, shape), row
        assert row[7].startswith("hierarchical") == even, row  # two-level: plain or pipelined
        assert row[8] == n, row


@emulation
def test_ranks_on_three_nodes_of_two():
    _check_places(6, 3)


@emulation
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
@pytest.mark.parametrize("n,nodes", [(6, 2), (5, 2)])
def test_ranks_on_two_nodes_of_three_and_unequal(n, nodes):
    _check_places(n, nodes)


# -- restarts on the nodes left (launcher/supervisor.py; issue 60) ------------------------------
def _train(tmp, *run_args, layout=("--dp", "3", "--tp", "2"), steps=6, folder="ck"):
    """`minipar run ... minipar train` of the tiny GPT (2 layers), sharded checkpoints every 2
    steps into tmp/folder; the completed process."""
    cmd = [sys.executable, "-m", "minipar", "run", "--timeout", "400", *run_args,
           "-m", "minipar", "train", *layout, "--batch-size", "12", "--steps", str(steps),
           "--layers", "2", "--checkpoint-every", "2",
           "--checkpoint-dir", str(tmp / folder)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", MINIPAR_TIMEOUT="10")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env)


@emulation
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
@pytest.mark.parametrize("fault", ["kill-node:1@step=3", "pull-link:1@step=3"])
def test_training_restarts_on_the_nodes_left(fault, tmp_path):
    """dp 3 x tp 2 on 3 nodes; node1 killed (or its cable pulled) after step 3: the job ends,
    starts again on 2 nodes at dp 2 x tp 2 from the checkpoint of step 2 (of step 4 where the
    fault came late) and finishes. Its final weights are, bit for bit, those of a run that
    makes the same change at the same step without a fault (dp 3 x tp 2 to that step, then dp
    2 x tp 2 to step 6, on one node)."""
    import json

    import torch

    from minipar.models import checkpoint_files, checkpoint_loader

    log = tmp_path / "restarts.json"
    done = _train(tmp_path, "--nodes", "3", "-n", "6", "--max-restarts", "1", "--fault", fault,
                  "--restart-log", str(log))  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (restart,) = json.loads(log.read_text())["restarts"]
    assert restart["nodes_after"] == 2 and restart["ranks_after"] == 4, restart
    # the checkpoint of step 2, or of step 4 where the kill landed after it was whole (a busy
    # machine: the fault's signal is late); the reference changes layout at the same step
    resumed = restart["resumed_from"]
    assert resumed in (2, 4) and restart["steps_lost"] == restart["step_reached"] - resumed
    assert "refitted to 4 ranks: dp 3 -> 2" in done.stderr, done.stderr[-3000:]
    first = _train(tmp_path, "-n", "6", steps=resumed, folder="ref")
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    then = _train(tmp_path, "-n", "4", layout=("--dp", "2", "--tp", "2"), folder="ref")
    assert then.returncode == 0, (then.stdout + then.stderr)[-3000:]
    got, _ = checkpoint_loader.load_dense(checkpoint_files.step_dir(tmp_path / "ck", 6))
    want, _ = checkpoint_loader.load_dense(checkpoint_files.step_dir(tmp_path / "ref", 6))
    for name, w in want.items():
        assert torch.equal(got[name], w), name


@emulation
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
def test_hybrid_sharding_restarts_on_the_node_left(tmp_path):
    """Hybrid sharding dp 4 = shard 2 x replicate 2 on 2 nodes (each node one shard group, the
    replicas across); node1 killed after step 3: the job starts again on node0 at dp 2, shard 2
    x replicate 1 (full FSDP over the node left), from the newest whole checkpoint (step 2's,
    written by node0's replica alone; step 4's where the kill came late) and finishes. Its
    final weights are, bit for bit, those of a run that makes the same change at the same step
    without a fault, on one node."""
    import json

    import torch

    from minipar.models import checkpoint_files, checkpoint_loader

    hybrid, log = ("--dp-shard", "2", "--dp-replicate", "2"), tmp_path / "restarts.json"
    done = _train(tmp_path, "--nodes", "2", "-n", "4", "--max-restarts", "1", "--fault",
                  "kill-node:1@step=3", "--restart-log", str(log), layout=hybrid)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (restart,) = json.loads(log.read_text())["restarts"]
    assert restart["nodes_after"] == 1 and restart["ranks_after"] == 2, restart
    # the checkpoint of step 2, or of step 4 where the kill landed after it was whole (a
    # busy machine: the fault's signal is late); the reference changes layout at the same step
    resumed = restart["resumed_from"]
    assert resumed in (2, 4) and resumed <= restart["step_reached"], restart
    assert "dp 4 -> 2" in done.stderr and "--dp-replicate 2 -> 1" in done.stderr, done.stderr
    first = _train(tmp_path, "-n", "4", layout=hybrid, steps=resumed, folder="ref")
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    then = _train(tmp_path, "-n", "2", layout=("--dp-shard", "2"), folder="ref")
    assert then.returncode == 0, (then.stdout + then.stderr)[-3000:]
    got, _ = checkpoint_loader.load_dense(checkpoint_files.step_dir(tmp_path / "ck", 6))
    want, _ = checkpoint_loader.load_dense(checkpoint_files.step_dir(tmp_path / "ref", 6))
    for name, w in want.items():
        assert torch.equal(got[name], w), name


def test_the_system_folders_join_a_students_path(monkeypatch):
    """Debian's /etc/profile gives a user PATH=/usr/local/bin:/usr/bin:/bin, without /usr/sbin
    where iproute2 puts ip and tc: the three system folders are added after it, in order; a
    PATH that has them (root's) is left as it is."""
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    needs.missing()
    assert os.environ["PATH"] == "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
    root = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    monkeypatch.setenv("PATH", root)
    needs.system_dirs_on_path()
    assert os.environ["PATH"] == root
