"""The pytest side of multi-rank tests: launch a suite once, check its cases one by one.

    SUITE = "tests/ranks/transport.py"

    @pytest.mark.parametrize("size,name", harness.params(SUITE, [1, 2, 4]))
    def test_transport(size, name):
        harness.run_suite(SUITE, size).check(name)

A case that raised on any rank fails with every failing rank's traceback; a case with no result
(the job crashed or hit its timeout) fails with the end of the job's stderr. Nothing can hang:
every wait inside the ranks has MINIPAR_TIMEOUT (default here 10 s) and the whole job a deadline.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import sys
import tempfile
import time

from minipar import launcher
from minipar.testing.worker import load_suite

CASE_TIMEOUT = "10"  # seconds any single wait may take inside a test job


@functools.cache
def case_names(suite: str, size: int) -> list[str]:
    return list(load_suite(suite).cases(size))


def params(suite: str, sizes) -> list[tuple[int, str]]:
    return [(size, name) for size in sizes for name in case_names(suite, size)]


class SuiteResult:
    def __init__(self, suite, size, backend, ranks, returncode, stderr, seconds):
        self.suite, self.size, self.backend = suite, size, backend
        self.ranks, self.returncode, self.stderr, self.seconds = ranks, returncode, stderr, seconds

    def check(self, name: str) -> None:
        failures, missing = [], []
        for rank in range(self.size):
            result = self.ranks.get(rank, {}).get(name)
            if result is None:
                missing.append(rank)
            elif not result["ok"]:
                failures.append(f"--- rank {rank} ---\n{result['error']}")
        where = f"{os.path.basename(self.suite)} [{name}] on {self.size} ranks ({self.backend})"
        if failures:
            raise AssertionError(f"{where} failed:\n" + "\n".join(failures))
        if missing:
            tail = self.stderr[-4000:]
            raise AssertionError(
                f"{where}: no result from ranks {missing} (job exit {self.returncode} after "
                f"{self.seconds:.1f} s)\n--- stderr ---\n{tail}"
            )


@functools.cache
def run_suite(suite: str, size: int, backend: str = "mpi", timeout: float | None = None):
    """Launch `suite` on `size` ranks once (cached) and collect every rank's results."""
    names = case_names(suite, size)
    if timeout is None:
        timeout = min(60 + 3 * len(names) + 2 * size, 850)  # below pytest's own 900 s
    outdir = tempfile.mkdtemp(prefix="minipar-test-")
    argv = ["-m", "minipar.testing.worker", suite, outdir]
    env_timeout = os.environ.get("MINIPAR_TIMEOUT")
    os.environ["MINIPAR_TIMEOUT"] = env_timeout or CASE_TIMEOUT
    start = time.monotonic()
    try:
        if backend == "mpi":
            done = launcher.run(size, argv, timeout=timeout, capture=True)
        else:
            done = _spawn(argv + ["--backend", "torch", "--size", str(size)], timeout)
    finally:
        if env_timeout is None:
            del os.environ["MINIPAR_TIMEOUT"]
    ranks = {}
    for path in glob.glob(os.path.join(outdir, "rank*.json")):
        with open(path) as f:
            ranks[int(os.path.basename(path)[4:-5])] = json.load(f)
    return SuiteResult(
        suite, size, backend, ranks, done.returncode, done.stderr or "", time.monotonic() - start
    )


def _spawn(argv, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.setdefault("MINIPAR_OVERSUBSCRIBED", "1")
    return launcher.run_command([sys.executable, *argv], env, timeout, capture=True)
