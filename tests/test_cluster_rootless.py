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

import contextlib
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
    # the dead job's folder waits for a sweep: ours below, or one of another `--nodes` job
    # that the suite's other lane ran meanwhile (it sweeps first)
    leftovers.sweep()
    left = [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"minipar-{proc.pid}-")]
    assert not left, left
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


def _as_user(command: str, timeout: float = 120, user: str = USER) -> subprocess.CompletedProcess:
    return _finish(_start_as(user, command), timeout)


def _finish(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """proc's outcome; past `timeout` seconds its whole session is killed (a hung job's ranks
    hold its pipes) and the outcome says so."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop.signal_pid(-proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(killed after {timeout:g} s)"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _start_as(user: str, command: str) -> subprocess.Popen:
    """`sh -c command` as `user`, started now (the caller may start another beside it)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": ROOT,
           "OMP_NUM_THREADS": "1", "MINIPAR_TIMEOUT": "20", "HOME": "/tmp"}  # fmt: skip
    who = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"]
    return subprocess.Popen([*who, "sh", "-c", command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd="/",
                            start_new_session=True)  # fmt: skip


@contextlib.contextmanager
def _made_users(*names: str):
    """Users made for a test (no home, no login), removed after with what they ran; each
    name's uid, and the python they run minipar with."""
    if not IS_ROOT or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("makes a user: root, useradd and setpriv")
    try:
        for name in names:
            subprocess.run(["userdel", name], capture_output=True, check=False)  # a killed run's
            subprocess.run(["useradd", "-M", "-s", "/bin/sh", name], check=True,
                           capture_output=True)  # fmt: skip
        python = _user_python()
        probe = _as_user(f"cd {ROOT} && {python} -c 'import minipar, mpi4py, numpy'", 60,
                         names[0])  # fmt: skip
        if probe.returncode != 0:
            pytest.skip(f"user {names[0]} cannot run {python} with minipar "
                        f"({probe.stderr.strip()}); MINIPAR_TEST_USER_PYTHON may name one it "
                        "can")  # fmt: skip
        yield {name: pwd.getpwnam(name).pw_uid for name in names}, python
    finally:
        for name in names:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True, check=False)
            subprocess.run(["userdel", name], capture_output=True, check=False)


@pytest.fixture
def unprivileged():
    """A user made for this test, removed after with what it owned: (uid, python)."""
    with _made_users(USER) as (uids, python):
        yield uids[USER], python


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


# -- a class on one server: several users at the same moment ------------------------------------
STUDENTS = ("minipar-test-a", "minipar-test-b")
TWO_NODES = f"mpiexec -hosts node0:2,node1:2 -n 4 python {WHERE}"


def _at_once(commands: dict, timeout: float = 300) -> dict:
    """Each user's command, all started at the same moment: user -> CompletedProcess."""
    started = {user: _start_as(user, command) for user, command in commands.items()}
    end = time.monotonic() + timeout
    return {u: _finish(p, max(1.0, end - time.monotonic())) for u, p in started.items()}


def _nothing_of(uids) -> None:
    """None of the users' processes, nor a file of theirs in /tmp or /dev/shm, is left."""
    time.sleep(0.2)
    for uid in uids:
        ps = subprocess.run(["pgrep", "-u", str(uid)], capture_output=True, text=True)
        alive = [p for p in ps.stdout.split() if leftovers.started_at(int(p)) is not None]
        assert alive == [], f"uid {uid}'s processes outlived their jobs: {alive}"
        for folder in (tempfile.gettempdir(), "/dev/shm"):
            theirs = [n for n in os.listdir(folder) if _owner(os.path.join(folder, n)) == uid]
            assert theirs == [], f"uid {uid} left {theirs} in {folder}"


def _owner(path: str) -> int | None:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None


@userns
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
@pytest.mark.timeout(1200)
def test_students_at_the_same_moment():
    """Two unprivileged users: `minipar run --nodes 2` at the same moment, three times (their
    namespaces count pids from 1 and both launchers run on a node0, so MPICH computed the same
    segment names: one job died in MPI_Init, "Out of memory", or hung until "job exit 124");
    `minipar grade --nodes 2` on the worked answers at the same moment; a standing cluster
    each beside root's, a plain mpiexec in all three at once, twice. Every job right, and
    nothing of theirs left."""
    with _made_users(*STUDENTS) as (uids, python):
        for attempt in range(3):
            command = f"{python} -m minipar run --nodes 2 -n 4 --timeout 120 {WHERE}"
            runs = _at_once({u: command for u in uids})
            for user, run in runs.items():
                assert run.returncode == 0, f"try {attempt}, {user}: {run.stdout}{run.stderr}"
                assert _where(run.stdout) == FOUR_ON_TWO, f"{user}: {run.stdout}"
        grade = f"{python} -m minipar grade --solutions ex04_hierarchical_allreduce --nodes 2"
        for user, run in _at_once({u: grade for u in uids}, timeout=600).items():
            assert run.returncode == 0, f"{user}: {run.stdout}{run.stderr}"
        _standing_beside_roots(uids, python)
        _nothing_of(uids.values())


def _standing_beside_roots(uids: dict, python: str) -> None:
    """Root's standing cluster and one a user, up together; plain mpiexec in each at once."""
    tmp = tempfile.mkdtemp(prefix="mp-")  # root's: a TMPDIR of its own, beside other tests'
    root_env = dict(os.environ, TMPDIR=tmp, OMP_NUM_THREADS="1", MINIPAR_TIMEOUT="20")
    cluster = [sys.executable, "-m", "minipar", "cluster"]
    up = subprocess.run([*cluster, "up", "--nodes", "2"], capture_output=True, text=True,
                        timeout=180, env=root_env)  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        for user, run in _at_once({u: f"{python} -m minipar cluster up --nodes 2"
                                   for u in uids}).items():  # fmt: skip
            assert run.returncode == 0, f"{user}: {run.stdout}{run.stderr}"
        shell = f"{python} -m minipar cluster shell node0 -- sh -c '{TWO_NODES}'"
        for attempt in range(2):
            root = subprocess.Popen([*cluster, "shell", "node0", "--", "sh", "-c", TWO_NODES],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=root_env)  # fmt: skip
            runs = _at_once({u: shell for u in uids})
            out, err = root.communicate(timeout=300)
            assert root.returncode == 0 and _where(out) == FOUR_ON_TWO, f"root: {out}{err}"
            for user, run in runs.items():
                assert run.returncode == 0, f"try {attempt}, {user}: {run.stdout}{run.stderr}"
                assert _where(run.stdout) == FOUR_ON_TWO, f"{user}: {run.stdout}"
    finally:
        _at_once({u: f"{python} -m minipar cluster down" for u in uids})
        subprocess.run([*cluster, "down"], capture_output=True, timeout=120, env=root_env)
        shutil.rmtree(tmp, ignore_errors=True)
