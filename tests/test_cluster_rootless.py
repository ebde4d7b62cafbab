"""Emulated nodes without root (minipar/launcher/cluster/rootless.py, docs/cluster.md "Without
root"): the same nodes, link and launcher inside a user namespace the job holds.

- refused before anything starts where the kernel forbids unprivileged user namespaces (made
  real here: a user namespace whose user.max_user_namespaces is 0), naming the reason and
  `minipar simulate`;
- as root asked to go the rootless way (MINIPAR_ROOTLESS=1): the cluster check (tests/ranks/
  cluster.py: node facts, bytes on the shaped link against the ledger, the same bits as on one
  node) and a job whose `minipar run` is SIGKILLed leaves nothing once the kernel ends it;
- as an unprivileged user this test creates (useradd; removed after): `minipar run --nodes`
  and a standing cluster, node map right, nothing left. Skipped with the reason where that
  user cannot run this Python (MINIPAR_TEST_USER_PYTHON names one it can).
MINIPAR_EXTENDED=1 (CI's cluster step) adds the cluster check and the unprivileged user; CI
also runs the cluster tests once as an unprivileged user it creates (.ci/run).
"""

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import ROOT, ranks_suite

from minipar.launcher import stop
from minipar.launcher.cluster import leftovers, needs, rootless
from minipar.launcher.cluster.job import emulated
from minipar.launcher.cluster.nodes import namespaces
from minipar.testing import harness

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
WHERE = os.path.join(SCRIPTS, "nodes_where.py")
IS_ROOT = os.geteuid() == 0


def _why_not() -> str:
    lacks = [line for line in needs.missing() if not line.startswith("root")]
    if lacks:
        return "; ".join(lacks)
    os.environ[rootless.FORCE_ENV] = "1"
    try:
        return rootless.why_not()
    finally:
        del os.environ[rootless.FORCE_ENV]


WHY_NOT = _why_not()
userns = pytest.mark.skipif(bool(WHY_NOT), reason=f"no user namespaces here: {WHY_NOT}")


def _where(out: str) -> list[tuple]:
    rows = [line.split()[1:] for line in out.splitlines() if line.startswith("WHERE")]
    return sorted((int(r), int(n), int(lr), int(nn), h) for r, n, lr, nn, h in rows)


# 2 nodes x 2 ranks, filled in blocks: (rank, node_rank, local_rank, num_nodes, hostname)
FOUR_ON_TWO = [(0, 0, 0, 2, "node0"), (1, 0, 1, 2, "node0"), (2, 1, 0, 2, "node1"),
               (3, 1, 1, 2, "node1")]  # fmt: skip


def _env(**extra) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", MINIPAR_TIMEOUT="20", PYTHONPATH=ROOT, **extra)


# -- refused where the kernel forbids it ------------------------------------------------------
@pytest.mark.skipif(not IS_ROOT, reason="makes a user namespace with the limit at 0 (root)")
@userns
def test_refused_where_user_namespaces_are_off():
    """Inside a user namespace whose limit of nested ones is 0, as a student's kernel with
    user.max_user_namespaces = 0: refused before any rank starts, the reason and simulate named."""
    job = [sys.executable, "-m", "minipar", "run", "--nodes", "2", "-n", "2", WHERE]
    script = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    cmd = ["unshare", "--user", "--map-root-user", "sh", "-c", script, "sh", *job]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          env=_env(**{rootless.FORCE_ENV: "1"}))  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert "user.max_user_namespaces = 0" in said, said
    assert "minipar simulate" in said and "(no --nodes)" in said, said
    assert "WHERE" not in done.stdout  # no rank ran


def test_a_switch_that_forbids_it_is_named(monkeypatch, tmp_path):
    """Each kernel switch, read as it is set where it forbids (a file standing in for /proc)."""
    for path, off in rootless.SYSCTLS.items():
        fake = tmp_path / os.path.basename(path)
        fake.write_text(off + "\n")
        monkeypatch.setattr(rootless, "SYSCTLS", {str(fake): off})
        assert f"= {off}" in rootless.why_not() and fake.name in rootless.why_not()


# -- the rootless way, asked for as root ---------------------------------------------------------
@userns
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
def test_the_cluster_check_without_root(monkeypatch):
    """tests/ranks/cluster.py's cases on 2 nodes made the rootless way, none visible outside."""
    monkeypatch.setenv(rootless.FORCE_ENV, "1")
    suite = ranks_suite("cluster.py")
    before = namespaces()
    with emulated(2, "2gbit") as cluster:
        assert cluster.holder is not None and cluster.inside[0] == "nsenter"
        assert namespaces() == before  # in the job's own mount namespace, not the machine's
        result = harness.launch_suite(suite, 4, "mpi", 120, cluster)
        holder = cluster.holder.pid
    for name in harness.case_names(suite, 4):
        result.check(name)
    assert not os.path.exists(f"/proc/{holder}")  # PID 1 gone, and every process with it


@userns
def test_a_killed_owner_takes_its_rootless_job_with_it():
    """SIGKILL of `minipar run`: the holder's pipe closes, the kernel kills the ranks; only the
    folder is left, for the next sweep."""
    cmd = [sys.executable, "-m", "minipar", "run", "--nodes", "2", "-n", "2",
           os.path.join(SCRIPTS, "nodes_ok.py"), "wait"]  # fmt: skip
    mark = f"MINIPAR_TEST_MARK={os.getpid()}-{time.monotonic_ns()}"  # the job's processes carry it
    env = _env(**{rootless.FORCE_ENV: "1", "MINIPAR_TEST_MARK": mark.split("=")[1]})
    began = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    seen = ""
    while "ranks ready" not in seen:
        line = proc.stdout.readline()
        assert line, seen
        seen += line
    ranks = [p for p in _pids_with(mark) if p != proc.pid]
    assert len(ranks) >= 2, ranks  # the launcher, its proxies, the ranks
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    end = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") for p in ranks) and time.monotonic() < end:
        time.sleep(0.05)
    assert not [p for p in ranks if os.path.exists(f"/proc/{p}")], "ranks outlived the job"
    left = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"minipar-{proc.pid}-")]
    assert left, "the dead job's folder should be there to sweep"
    leftovers.sweep()
    assert not [n for n in os.listdir(tempfile.gettempdir()) if n in left]
    stop.remove_hydra_leftovers(began)  # hydra, SIGKILLed by the kernel, left its topology file


def _pids_with(entry: str) -> list[int]:
    """The processes whose environment holds `entry` (NAME=VALUE)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if entry.encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


# -- as an unprivileged user ---------------------------------------------------------------------
USER = "minipar-test"


def _user_python() -> str:
    return os.environ.get("MINIPAR_TEST_USER_PYTHON") or sys.executable


def _as_user(command: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": ROOT,
           "OMP_NUM_THREADS": "1", "MINIPAR_TIMEOUT": "20", "HOME": "/tmp"}  # fmt: skip
    who = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups"]
    return subprocess.run([*who, "sh", "-c", command], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd="/")  # fmt: skip


@pytest.fixture
def unprivileged():
    """A user made for this test (no home, no login), removed after with what it owned."""
    if not IS_ROOT or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("makes a user: root, useradd and setpriv")
    subprocess.run(["userdel", USER], capture_output=True, check=False)  # a killed run's
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", USER], check=True, capture_output=True)
    try:
        python = _user_python()
        probe = _as_user(f"cd {ROOT} && {python} -c 'import minipar, mpi4py, numpy'", 60)
        if probe.returncode != 0:
            pytest.skip(f"user {USER} cannot run {python} with minipar ({probe.stderr.strip()}); "
                        "MINIPAR_TEST_USER_PYTHON may name one it can")  # fmt: skip
        yield pwd.getpwnam(USER).pw_uid, python
    finally:
        subprocess.run(["pkill", "-KILL", "-u", USER], capture_output=True, check=False)
        subprocess.run(["userdel", USER], capture_output=True, check=False)


@userns
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
def test_as_an_unprivileged_user(unprivileged):
    """`minipar run --nodes 2 -n 4` and a standing cluster's plain mpiexec, as a user with no
    privilege at all; the node map right, the user's processes and files gone after."""
    uid, python = unprivileged
    run = _as_user(f"{python} -m minipar run --nodes 2 -n 4 {WHERE}")
    assert run.returncode == 0, run.stdout + run.stderr
    assert _where(run.stdout) == FOUR_ON_TWO, run.stdout
    mpiexec = f"mpiexec -hosts node0:2,node1:2 -n 4 python {WHERE}"
    standing = _as_user(f"{python} -m minipar cluster up --nodes 2 && {python} -m minipar "
                        f"cluster shell node0 -- sh -c '{mpiexec} && ssh node1 hostname'; "
                        f"s=$?; {python} -m minipar cluster down; exit $s")  # fmt: skip
    assert standing.returncode == 0, standing.stdout + standing.stderr
    assert _where(standing.stdout) == FOUR_ON_TWO, standing.stdout
    assert "\nnode1\n" in standing.stdout, standing.stdout  # ssh node1 hostname
    assert "without root" in standing.stderr
    time.sleep(0.2)
    ps = subprocess.run(["pgrep", "-u", str(uid)], capture_output=True, text=True)
    alive = [p for p in ps.stdout.split() if leftovers.started_at(int(p)) is not None]
    said = {p: open(f"/proc/{p}/cmdline").read().replace("\0", " ") for p in alive}
    assert alive == [], f"the user's processes outlived the cluster: {said}"  # zombies aside
    tmp = tempfile.gettempdir()
    assert [n for n in os.listdir(tmp) if os.stat(os.path.join(tmp, n)).st_uid == uid] == []
