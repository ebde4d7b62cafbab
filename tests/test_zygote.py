"""The pool's fork server (minipar.testing.zygote): the warm jobs' ranks are forked from one
process that has torch loaded, and each rank still looks like a rank that mpiexec started
itself, to its case, to mpiexec, and to the pool. The stand-in that mpiexec starts ends as its
rank ends, passes it the launcher's signals and descriptors, and takes it along when it dies."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ranks_suite

from minipar import launcher
from minipar.testing import harness, pool, zygote

SUITE = ranks_suite("harness_zygote.py")
SCRIPT = textwrap.dedent("""
    import gc, os, signal, sys, time
    print(f"rank process {os.getpid()} says {sys.argv[1:]}", flush=True)
    print(f"frozen {gc.get_freeze_count()}", flush=True)
    rank = int(os.environ.get("PMI_RANK", "0"))
    # without mpiexec, the client's stdin reaches the rank (hydra gives other ranks a pipe
    # that never ends)
    line = "" if "PMI_RANK" in os.environ else sys.stdin.readline()
    how = os.environ.get("HOW", "exit0")
    if how == "sleep":
        time.sleep(60)
    if how.startswith("exit") and rank == int(os.environ.get("WHO", "0")):
        sys.exit(int(how[4:]))
    if how == "raise" and rank == 0:
        raise RuntimeError("planted: " + line.strip())
    if how == "sigterm" and rank == 0:
        os.kill(os.getpid(), signal.SIGTERM)
""")


def ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def said(result, rank: int) -> dict:
    words = result.ranks[rank]["rank_is_itself"]["output"].split()
    return {words[i]: int(words[i + 1]) for i in range(0, len(words) - 1, 2)}


@pytest.fixture(scope="module")
def server():
    """One fork server for this file's tests; closing it must end the ranks it still has
    (`left`: a test's ranks still sleeping) and leave nothing behind."""
    started = zygote.Server(dict(os.environ))
    started.left = []
    assert started.ready(120), started.error
    yield started
    started.close()
    assert started.proc.returncode is not None and not os.path.exists(started.folder)
    for client, rank in started.left:
        assert gone(rank), f"rank {rank} outlived the server"
        client.wait(10)  # its client ends when the server does


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("zygote") / "rank.py"
    path.write_text(SCRIPT)
    return str(path)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")
def test_pool_ranks_are_forked_by_the_server():
    result = harness.run_suite.__wrapped__(SUITE, 2, "mpi")
    result.check("rank_is_itself")
    result.check("torch_as_launched")
    result.check("preloads_out_of_the_collectors_reach")
    the_pool = harness.pool()
    for rank in (0, 1):
        seen = said(result, rank)
        assert seen["rank"] == rank and seen["size"] == 2, seen
        assert seen["ppid"] == the_pool.zygote.proc.pid, (seen, the_pool.zygote.proc.pid)
        assert seen["pid"] in the_pool.ranks  # the pool kills and asks the rank itself


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")
@pytest.mark.own_job
def test_a_pytest_inside_a_test_borrows_the_server(tmp_path):
    """A process started with MINIPAR_FORK_SERVER (the grader's pytest, a harness self-test)
    has its pool's ranks forked by that server: no server of its own (no torch import), and
    it does not end the one it borrowed."""
    server = harness.pool().fork_server()
    script = textwrap.dedent(f"""
        from minipar.testing import harness
        result = harness.run_suite({SUITE!r}, 2, "mpi")
        result.check("rank_is_itself")
        print("ranks", *[result.ranks[r]["rank_is_itself"]["output"] for r in (0, 1)])
        print("own server", harness.pool().zygote.proc is not None, harness.pool().launches)
    """)  # fmt: skip
    env = dict(os.environ, TMPDIR=str(tmp_path))
    env[launcher.mpiexec.FORK_SERVER_ENV] = server.address
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ppid {server.proc.pid} " in done.stdout, done.stdout  # both ranks' parent
    assert done.stdout.count(f"ppid {server.proc.pid} ") == 2, done.stdout
    assert "own server False 1" in done.stdout, done.stdout
    assert server.proc.poll() is None and os.path.exists(server.address), "the server ended"
    harness.run_suite.__wrapped__(SUITE, 2, "mpi").check("rank_is_itself")  # and still serves


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")
def test_a_fork_server_started_early_forks_the_first_jobs_ranks(monkeypatch):
    """`minipar grade` starts its pool's fork server before pytest collects (its torch import
    overlaps the one-process tests): the jobs then use that server, none other is started,
    and the pool still ends it. A borrowed server (MINIPAR_FORK_SERVER) is never doubled."""
    monkeypatch.delenv(launcher.mpiexec.FORK_SERVER_ENV, raising=False)
    own = pool.Pool()
    try:
        own.start_fork_server()
        early = own.zygote
        assert early is not None and early.proc.poll() is None
        own.start_fork_server()  # again: the same server, not a second
        assert own.zygote is early and own.sessions == [early.proc.pid]
        job = own._job(2, "mpi")
        assert job.error is None, job.error
        parents = {pid: open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
                   for pid in job.pids.values()}  # fmt: skip
        assert set(parents.values()) == {str(early.proc.pid)}, parents
    finally:
        own.close()
    assert early.proc.poll() is not None, "the pool left its early fork server running"
    monkeypatch.setenv(launcher.mpiexec.FORK_SERVER_ENV, early.address)
    borrower = pool.Pool()
    borrower.start_fork_server()
    assert borrower.zygote is None and borrower.sessions == []


def test_a_rank_has_the_threads_its_job_asked_for(monkeypatch):
    """The server imported torch with one thread; a job launched with two gets two (torch
    fixes its count at import, so OMP_NUM_THREADS is a launch variable: a job of its own)."""
    harness.run_suite(SUITE, 2, "mpi").check("torch_as_launched")  # the server, started
    assert harness.pool().zygote is not None  # with the session's one thread
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    harness.run_suite.__wrapped__(SUITE, 2, "mpi").check("torch_as_launched")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")
def test_without_the_server_ranks_start_cold(monkeypatch):
    monkeypatch.setenv(zygote.ZYGOTE_ENV, "0")
    result = harness.run_suite.__wrapped__(SUITE, 2, "mpi")
    result.check("rank_is_itself")
    server = harness.pool().zygote
    for rank in (0, 1):
        seen = said(result, rank)
        assert server is None or seen["ppid"] != server.proc.pid, seen


@pytest.mark.parametrize(
    "how,rc", [("exit0", 0), ("exit3", 3), ("raise", 1), ("sigterm", -signal.SIGTERM)]
)
def test_client_ends_as_its_rank_ends(server, script, how, rc):
    """Without mpiexec: the client's argv, environment and standard streams reach the rank,
    and the client exits with the rank's status, or dies of the rank's signal."""
    done = subprocess.run(
        [sys.executable, *server.wrap([script, "a", "b"])], input="hello\n", text=True,
        capture_output=True, env=dict(os.environ, HOW=how), timeout=60,
    )  # fmt: skip
    assert done.returncode == rc, (done.returncode, done.stdout, done.stderr)
    assert "says ['a', 'b']" in done.stdout, done.stdout
    assert "starting cold" not in done.stderr, done.stderr
    frozen = int(done.stdout.split("frozen ")[1].split()[0])  # the server's preloads (_freeze)
    assert frozen > 50_000, done.stdout
    if how == "raise":
        assert "RuntimeError: planted: hello" in done.stderr, done.stderr


MINIPAR_RANK = textwrap.dedent("""
    import sys, tempfile, time
    import helper  # beside the script: sys.path[0] is the script's folder, as for `python rank.py`
    import minipar, numpy as np
    comm = minipar.init()
    x = np.ones(3)
    minipar.all_reduce(x)
    minipar.finalize()
    if comm.rank:  # rank 0 ends first: hydra must see it end as a rank that finished
        time.sleep(0.5)
    print(f"rank {comm.rank} ended with {x[0]:g} in {tempfile.gettempdir()} via {helper.NAME}")
""")


def test_launcher_forks_minipar_ranks_that_end_apart(server, tmp_path, monkeypatch):
    """minipar's launcher with MINIPAR_FORK_SERVER (how the suite's own-job tests start their
    ranks warm): a script's folder on sys.path, the job's TMPDIR, and a job whose ranks finish
    at different times ending 0. A forked rank must tell the launcher it finished (MPICH's PMI
    finalize, in the C library's exit handlers): otherwise hydra, seeing rank 0's connection
    close, kills the ranks still running and the job ends with signal 9."""
    folder = tmp_path / "program"
    folder.mkdir()
    (folder / "rank.py").write_text(MINIPAR_RANK)
    (folder / "helper.py").write_text("NAME = 'the helper'\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv(launcher.mpiexec.FORK_SERVER_ENV, server.address)
    monkeypatch.setenv("TMPDIR", str(scratch))
    for _ in range(3):
        done = launcher.run(3, [str(folder / "rank.py")], timeout=120, capture=True)
        assert done.returncode == 0, done.stdout + done.stderr
        for rank in range(3):
            assert f"rank {rank} ended with 3 in {scratch} via the helper" in done.stdout
        assert "starting cold" not in done.stderr, done.stderr


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")
def test_minipar_run_forks_its_python_ranks(server, tmp_path, monkeypatch):
    """`minipar run script.py` (a whole command line starting with this Python) goes through
    the fork server too: the fault-injection and command-line tests' jobs start warm."""
    rank = tmp_path / "rank.py"
    rank.write_text("import os, sys\nprint('parent', os.getppid(), 'torch' in sys.modules)\n")
    monkeypatch.setenv(launcher.mpiexec.FORK_SERVER_ENV, server.address)
    done = subprocess.run([sys.executable, "-m", "minipar", "run", "-n", "2", str(rank)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(f"parent {server.proc.pid} True") == 2, done.stdout + done.stderr


@pytest.mark.parametrize("who", [0, 1])
def test_mpiexec_sees_the_status_it_would_see(server, script, who):
    """Under mpiexec, a job whose rank `who` exits 3 ends with the same status as the same job
    started cold; a job that ends well ends 0 (hydra kills a rank whose output has closed
    before its process ends: the client keeps the descriptors until it exits)."""
    env = dict(os.environ, HOW="exit3", WHO=str(who))
    statuses = []
    for argv in ([script], server.wrap([script])):
        cmd, job_env = launcher.command(2, argv)
        job_env.update(env)
        statuses.append(run(cmd, job_env))
    cold, warm = statuses
    assert warm.returncode == cold.returncode != 0, (cold, warm)
    cmd, job_env = launcher.command(2, server.wrap([script]))
    done = run(cmd, job_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("says") == 2, done.stdout


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")
def test_a_dead_client_takes_its_rank_along(server, script):
    """SIGKILL reaches the client, not the rank (another process): the server kills the rank;
    and closing the server ends every rank it still has (the fixture's end checks it)."""
    ranks = []
    for _ in range(2):
        client = subprocess.Popen(
            [sys.executable, *server.wrap([script])], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=dict(os.environ, HOW="sleep"),
        )  # fmt: skip
        ranks.append((client, int(client.stdout.readline().split()[2])))
    client, rank = ranks[0]
    assert ppid(rank) == server.proc.pid
    client.kill()
    client.wait()
    assert gone(rank), f"rank {rank} outlived its client"
    server.left.append(ranks[1])


def run(cmd, env):
    return subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.own_job
def test_own_job_tests_start_their_ranks_warm():
    """tests/conftest.py hands an own_job test the session's fork server (its launches fork
    their ranks from it), and only while that test runs."""
    server = harness.pool().fork_server()
    if server is None:
        pytest.skip("no fork server (MINIPAR_TEST_ZYGOTE=0)")
    assert os.environ.get(launcher.mpiexec.FORK_SERVER_ENV) == server.address


def test_other_tests_start_nothing_through_it():
    assert launcher.mpiexec.FORK_SERVER_ENV not in os.environ
