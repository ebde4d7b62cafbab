"""The pytest side of multi-rank tests: run a suite once, check its cases one by one.

    SUITE = "tests/ranks/transport.py"

    @pytest.mark.parametrize("size,name", harness.params(SUITE, [1, 2, 4]))
    def test_transport(size, name):
        harness.run_suite(SUITE, size).check(name)

`run_suite` runs every case of the suite on `size` ranks once (cached) and `check` raises for
one case: with every failing rank's traceback and what it printed, or, for ranks that gave no
result (they hung or died), why, with their output. Nothing can hang: every wait inside the
ranks has MINIPAR_TIMEOUT (default here 10 s), every case a limit (testing/pool.py), and the
whole suite `timeout`.

The cases run on the warm pool (testing/pool.py): one job per world size and transport serves
every suite of the pytest session. MINIPAR_TEST_POOL=0 launches one job per suite instead
(testing/worker.py), as before the pool. MINIPAR_TEST_LAUNCH_LOG=PATH appends a line per job
started (either way) to PATH, to count them.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import json
import os
import shutil
import sys
import time

from minipar import launcher
from minipar.launcher import own_folder
from minipar.launcher.cluster.job import emulated
from minipar.state import process
from minipar.testing import case
from minipar.testing import pool as warm
from minipar.testing.pool import CASE_TIMEOUT
from minipar.testing.worker import load_suite

POOL_ENV = "MINIPAR_TEST_POOL"
SKIP_GROUPS_ENV = "MINIPAR_TEST_SKIP_GROUPS"  # groups (a suite's group_of) not to run at all
LAUNCH_LOG_ENV = "MINIPAR_TEST_LAUNCH_LOG"


@functools.cache
def case_names(suite: str, size: int) -> list[str]:
    return list(load_suite(suite).cases(size))


def params(suite: str, sizes) -> list[tuple[int, str]]:
    return [(size, name) for size in sizes for name in case_names(suite, size)]


class SuiteResult:
    """Every rank's result of every case ({rank: {name: {"ok", "error", "output", "seconds"}}})
    and, for a case some ranks gave no result for, why (`notes`)."""

    def __init__(self, suite, size, backend, ranks, returncode, stderr, seconds, notes=None):
        self.suite, self.size, self.backend = suite, size, backend
        self.ranks, self.returncode, self.stderr, self.seconds = ranks, returncode, stderr, seconds
        self.notes = notes or {}

    def check(self, name: str) -> None:
        failures, missing = [], []
        for rank in range(self.size):
            result = self.ranks.get(rank, {}).get(name)
            if result is None:
                missing.append(rank)
            elif not result["ok"]:
                output = result.get("output") or ""
                shown = f"--- rank {rank} output ---\n{output}" if output.strip() else ""
                failures.append(f"--- rank {rank} ---\n{result['error']}{shown}")
        where = f"{os.path.basename(self.suite)} [{name}] on {self.size} ranks ({self.backend})"
        why = self.notes.get(name) or (
            f"job exit {self.returncode} after {self.seconds:.1f} s\n--- stderr ---\n"
            f"{self.stderr[-4000:]}"
        )
        if missing and failures and name in self.notes:  # the others failed waiting on them:
            raise AssertionError(  # the ranks that never answered come first, as the cause
                f"{where}: no result from ranks {missing}: {why}\nthe other ranks, which "
                "failed waiting on them:\n" + "\n".join(failures)
            )
        if failures:
            raise AssertionError(f"{where} failed:\n" + "\n".join(failures))
        if missing:
            raise AssertionError(f"{where}: no result from ranks {missing}: {why}")


@functools.cache
def run_suite(
    suite: str,
    size: int,
    backend: str = "mpi",
    timeout: float | None = None,
    nodes: int | None = None,
    link: str = "2gbit",
):
    """Run every case of `suite` on `size` ranks once (cached) and collect every rank's results.
    `timeout`: seconds the whole suite may take (default from its number of cases). `nodes`:
    on that many emulated nodes (launcher/cluster/, the link at `link`), a job of its own."""
    names = case_names(suite, size)
    if timeout is None:
        timeout = min(60 + 3 * len(names) + 2 * size, 850)  # below pytest's own 900 s
    if nodes is not None:
        return _on_nodes(suite, size, timeout, nodes, link)
    if os.environ.get(POOL_ENV, "1") == "0":
        return launch_suite(suite, size, backend, timeout)
    start = time.monotonic()
    loaded = load_suite(suite)
    limit = float(getattr(loaded, "CASE_LIMIT", 0)) or None
    group_of = getattr(loaded, "group_of", None)  # a broken case takes its group with it
    skipped = set(filter(None, os.environ.get(SKIP_GROUPS_ENV, "").split(",")))
    if group_of is not None and skipped:
        names = [n for n in names if group_of(n) not in skipped]
    settings = {"timeout": os.environ.get("MINIPAR_TIMEOUT") or CASE_TIMEOUT}
    the_pool = pool()
    launched = the_pool.launches
    results, notes, returncode, log = the_pool.run(
        os.path.abspath(suite), size, backend, names, timeout,
        limit or warm.CASE_LIMIT, settings, group_of,
    )  # fmt: skip
    for _ in range(the_pool.launches - launched):
        _log_launch("pool", suite, size, backend)
    ranks = {rank: {} for rank in range(size)}
    for name, by_rank in results.items():
        for rank, result in by_rank.items():
            ranks[rank][name] = result
    return SuiteResult(
        suite, size, backend, ranks, returncode, log, time.monotonic() - start, notes
    )


# -- the warm pool of this process (testing/pool.py; kept as process.test_pool) -------------
def pool() -> warm.Pool:
    """This process's warm pool, made on first use (and closed at exit, or by close())."""
    if process.test_pool is None:
        process.test_pool = warm.Pool()
        atexit.register(close)
    return process.test_pool


def close() -> list:
    """End every warm job (pytest's session end, see tests/conftest.py; and at exit); each
    job's exit status, as Pool.close gives them."""
    the_pool, process.test_pool = process.test_pool, None
    return the_pool.close() if the_pool is not None else []


@functools.cache
def _on_nodes(suite: str, size: int, timeout: float, nodes: int, link: str) -> SuiteResult:
    return launch_suite(suite, size, "mpi", timeout, nodes=(nodes, link))


# -- one launch per suite (MINIPAR_TEST_POOL=0; and what the pool replaced) -----------------
def launch_suite(
    suite: str, size: int, backend: str, timeout: float, cluster=None, nodes=None
) -> SuiteResult:
    """Launch `suite` on `size` ranks for this call alone (on an EmulatedCluster's nodes when
    given, or on `nodes` = (N, link) made for it); its folder is removed afterwards. Nodes made
    here are taken down before the results are read and the folder removed: a rank of a job
    that timed out may write in it until its node goes."""
    outdir = own_folder.make("test")
    argv = ["-m", "minipar.testing.worker", suite, outdir]
    env_timeout = os.environ.get("MINIPAR_TIMEOUT")
    os.environ["MINIPAR_TIMEOUT"] = env_timeout or CASE_TIMEOUT
    start = time.monotonic()
    _log_launch("suite", suite, size, backend)
    try:
        with emulated(*nodes) if nodes else contextlib.nullcontext(cluster) as on:
            if backend == "mpi":
                done = launcher.run(size, argv, timeout=timeout, capture=True, cluster=on)
            else:
                done = _spawn(argv + ["--backend", "torch", "--size", str(size)], timeout)
        ranks, notes = _read_results(outdir, size, case_names(suite, size), done)
    finally:
        if env_timeout is None:
            del os.environ["MINIPAR_TIMEOUT"]
        shutil.rmtree(outdir, ignore_errors=True)
    return SuiteResult(
        suite, size, backend, ranks, done.returncode, done.stderr or "",
        time.monotonic() - start, notes,
    )  # fmt: skip


def _read_results(outdir: str, size: int, names, done):
    """Every rank's results, and for each case some ranks never finished, why: the job's exit,
    its stderr and what those ranks printed last."""
    ranks = {}
    for path in glob.glob(os.path.join(outdir, "rank*.json")):
        with open(path) as f:
            ranks[int(os.path.basename(path)[4:-5])] = json.load(f)
    tail = (done.stderr or "")[-4000:]
    notes = {}
    for name in names:
        missing = [r for r in range(size) if name not in ranks.get(r, {})]
        if missing:
            outputs = "".join(
                f"\n--- rank {r} output (its last case) ---\n"
                + case.read_tail(os.path.join(outdir, f"rank{r}.out"), 6000)
                for r in missing
            )
            notes[name] = f"job exit {done.returncode}\n--- stderr ---\n{tail}{outputs}"
    return ranks, notes


def _spawn(argv, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.setdefault("MINIPAR_OVERSUBSCRIBED", "1")
    return launcher.run_command([sys.executable, *argv], env, timeout, capture=True)


def _log_launch(kind: str, suite: str, size: int, backend: str) -> None:
    path = os.environ.get(LAUNCH_LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{kind} {backend} {size} {os.path.basename(suite)}\n")
