import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import lanes
import pytest

from minipar.launcher import own_folder, shm_leftovers, stop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# torch's, not minipar's: torchrun's folder, the compile cache, a spawned rank's error record
TORCH_LEFTOVERS = ("torchelastic_", "torchinductor_", "pytorch-errorfile-")


def run_job(argv, minipar_timeout: float | None, limit: float):
    """Run a job that is meant to fail, as a session of its own, with MINIPAR_TIMEOUT set (None:
    minipar's default timeout): only past `limit` seconds is its process group killed (rc 124),
    so the launcher's own clean-up is what is tested. Returns (rc, output, start, end, pid).
    The job's TMPDIR is a folder of its own: anything minipar leaves there fails the test
    (torch's own files excepted: TORCH_LEFTOVERS), and the folder is removed."""
    scratch = tempfile.mkdtemp(prefix="minipar-job-")
    try:
        done = _run_job(argv, minipar_timeout, limit, scratch)
        left = [name for name in os.listdir(scratch) if not name.startswith(TORCH_LEFTOVERS)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert not left, f"{argv}: left in its TMPDIR: {left}\n{done[1][-2000:]}"
    return done


def _run_job(argv, minipar_timeout, limit, scratch):
    env = dict(os.environ, MINIPAR_TIMEOUT=str(minipar_timeout), OMP_NUM_THREADS="1")
    env["TMPDIR"] = scratch
    if minipar_timeout is None:
        del env["MINIPAR_TIMEOUT"]
    for default in ("MINIPAR_DEBUG", "MINIPAR_MISMATCH_AFTER"):
        env.pop(default, None)
    start = time.time()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        stop.signal_pid(-proc.pid, signal.SIGKILL)  # the test fails: no grace for it
        output, _ = proc.communicate()
        return 124, output, start, time.time(), proc.pid
    return proc.returncode, output, start, time.time(), proc.pid


def warm_python(args) -> list[str]:
    """`python ARGS` forked warm by the session's fork server (minipar.testing.zygote: torch
    already imported, ~2 s of a core saved), or started cold where there is none: for commands
    whose own start-up is not what the test checks (the CLI's training, grading, benchmark)."""
    from minipar.testing import harness

    server = harness.pool().fork_server()
    return [sys.executable, *(server.wrap(list(args)) if server else args)]


def ranks_suite(name: str) -> str:
    """Path of a rank-side suite in tests/ranks/."""
    return os.path.join(ROOT, "tests", "ranks", name)


def bytecode_cache(config) -> None:
    """The suite starts some 300 Python processes (ranks, launchers, CLIs); with bytecode
    caching off (PYTHONDONTWRITEBYTECODE) each one compiles minipar from source again (~0.2 s of
    a core). So the session turns caching back on; the __pycache__ folders it makes in the
    checkout are removed at its end (nothing is left beside the sources). Not a cache folder
    of the session's own (PYTHONPYCACHEPREFIX): Python then ignores the installed packages'
    __pycache__, and the first import of torch in each xdist worker compiled ~1,500 modules
    again (~8 s of a core each, before the first test). A PYTHONPYCACHEPREFIX of the caller's
    is used, and kept. torch._dynamo's compile cache (made when an optimizer first steps) goes
    to a folder of the session's, not $TMPDIR/torchinductor_$USER."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    if hasattr(config, "workerinput"):  # an xdist worker: the controller cleans up
        return
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        made = own_folder.make("inductor")  # named after us: a killed session's is swept
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = made
        config.add_cleanup(lambda: shutil.rmtree(made, ignore_errors=True))
    if not os.environ.get("PYTHONPYCACHEPREFIX"):
        before = set(pycaches(ROOT))
        config.add_cleanup(lambda: remove_new_pycaches(before))


def pycaches(top: str):
    """The __pycache__ folders under `top` (hidden folders, the virtual environments, skipped)."""
    for root, dirs, _ in os.walk(top):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if os.path.basename(root) == "__pycache__":
            dirs[:] = []
            yield root


def remove_new_pycaches(before: set) -> None:
    for folder in set(pycaches(ROOT)) - before:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # every job of the session shares the cores with the other lane's jobs (tests/lanes.py):
    # a wait that spins (a 1- or 2-rank job on 2 cores would, 2 ms then 50 ms of yields that do
    # not yield) takes the core from the rank it waits for. Measured: test_collectives beside
    # test_faults 5-7% faster, 6% fewer core-seconds (two A/B pairs)
    os.environ.setdefault("MINIPAR_OVERSUBSCRIBED", "1")
    # a developer's `minipar calibrate` must not move `auto`'s choices or the lessons' numbers
    # under the tests: a file that does not exist (tests that want one set their own)
    os.environ["MINIPAR_CALIBRATION"] = os.path.join(
        tempfile.gettempdir(), f"minipar-tests-no-calibration-{os.getpid()}", "none.json"
    )
    bytecode_cache(config)
    config.addinivalue_line(
        "markers", "slow: long-running: CI's long checks only (MINIPAR_EXTENDED=1), skipped else"
    )
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped, with why, without)")
    config.addinivalue_line(
        "markers", "cold: an own_job test whose ranks must start cold (not forked warm)"
    )
    config.addinivalue_line(
        "markers",
        "own_job: launches its own job (fault injection, the launcher, the CLI, init itself, "
        "torchrun) instead of running on the harness's warm pool",
    )


def pytest_runtest_setup(item):
    """With MINIPAR_TEST_LAUNCH_LOG=PATH, each test that launches a job of its own adds a line
    to PATH ("own NODEID"), beside the harness's lines for the jobs it starts (pool, suite)."""
    path = os.environ.get("MINIPAR_TEST_LAUNCH_LOG")
    if path and item.get_closest_marker("own_job") is not None:
        with open(path, "a") as f:
            f.write(f"own {item.nodeid}\n")


@pytest.fixture(autouse=True)
def warm_own_jobs(request, monkeypatch):
    """A test that launches its own job through minipar's launcher has its ranks forked from
    the session's fork server (MINIPAR_FORK_SERVER, minipar.testing.zygote), torch already
    imported, instead of each importing it (~2 s of a core per rank). Not with the marker
    `cold` (a test of how ranks start), nor with MINIPAR_TEST_ZYGOTE=0."""
    node = request.node
    if node.get_closest_marker("own_job") is None or node.get_closest_marker("cold") is not None:
        return
    from minipar.launcher.mpiexec import FORK_SERVER_ENV
    from minipar.testing import harness

    server = harness.pool().fork_server()
    if server is not None:
        monkeypatch.setenv(FORK_SERVER_ENV, server.address)


SESSION_BEGAN = time.time()
SEGMENTS_BEFORE = shm_leftovers.present()  # /dev/shm's MPICH segments when the session began


def pytest_sessionfinish(session, exitstatus):
    """End the harness's warm jobs (minipar.testing.pool) with the session, then remove the
    topology files of hydra's aborted jobs (fault tests abort on purpose) that the launcher
    could not while the pool's proxies ran, and the shared-memory segments the session's dead
    jobs left in /dev/shm (a rank killed, or ended by MPI_Abort, never frees its windows):
    only this user's, made during the session, that no live process maps. How many were left
    is printed (MINIPAR_SHM_LEFTOVERS=fail makes it fail the session: a check for the jobs'
    own clean-up, launcher/stop.py)."""
    from minipar.testing import harness

    harness.close()
    stop.remove_hydra_leftovers(SESSION_BEGAN)
    removed = shm_leftovers.sweep(SEGMENTS_BEFORE)
    if removed:
        print(
            f"\nremoved {len(removed)} shared-memory segments the session's jobs left in /dev/shm"
        )
        if os.environ.get("MINIPAR_SHM_LEFTOVERS") == "fail":
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


# -- the exercises' grader: which tree the exercise tests import (tests/test_exercises.py) ------


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        default="solutions",
        help="the exercise tests run against 'solutions' (default), 'exercises', or a folder",
    )
    parser.addoption(
        "--lanes",
        default="on",
        choices=["on", "off"],
        help="with xdist's workers (-n 2): the waiting files on one worker, the rest on the "
        "other (tests/lanes.py); off: xdist's own scheduling",
    )


WORKERS = 2  # xdist's workers for the whole suite: one per lane (tests/lanes.py)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """The whole suite (`python -m pytest`, no path named) runs on two xdist workers, in two
    lanes; a file or test named runs in this process, as do -n 0, --pdb and -p no:xdist (and
    everything where pytest-xdist is not installed). Before xdist's own hook reads the option."""
    option = config.option
    named = getattr(config, "args_source", None) == pytest.Config.ArgsSource.ARGS
    if (
        getattr(option, "numprocesses", 0) is None  # xdist is here, and -n not given
        and not getattr(option, "tx", None)
        and getattr(option, "dist", "no") == "no"
        and not hasattr(config, "workerinput")  # (a worker itself)
        and not option.usepdb
        and not named
    ):
        option.numprocesses = WORKERS


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's workers take the suite in two lanes (tests/lanes.py)."""
    if config.getoption("lanes") == "on":
        return lanes.scheduler(config, log)
    return None


@pytest.fixture(scope="session")
def exercise_impl(request):
    """The folder of exNN_*.py files under test; the multi-rank suite reads it from the
    environment (the harness passes os.environ to the ranks)."""
    from minipar import exercises

    folder = str(exercises.tree(request.config.getoption("--impl")))
    os.environ["MINIPAR_EXERCISES_IMPL"] = folder
    return folder


# -- GPU tests: `pytest -m gpu` selects them; without a CUDA device they skip, saying why -----


def pytest_collection_modifyitems(config, items):
    if os.environ.get("MINIPAR_EXTENDED") != "1":  # the README's suite stays short
        for item in items:
            if item.get_closest_marker("slow") is not None:
                item.add_marker(pytest.mark.skip(reason="MINIPAR_EXTENDED=1 (CI's long checks)"))
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu:
        return
    why = _no_cuda_reason()
    if why:
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=why))


def _no_cuda_reason() -> str:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}, CUDA build: {torch.version.cuda})"
    return ""
