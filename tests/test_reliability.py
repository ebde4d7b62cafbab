"""Reliability on real ranks: bad input, debug mode, timeouts, mismatches, concurrency.

The rank-side cases live in tests/ranks/reliability*.py (one launch per world size and transport
runs them all); docs/errors.md has the table of bad-input cases and their messages.
Single-process checks (before init, after finalize, settings) run in a fresh interpreter each,
so the pytest process's own minipar state never matters.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, ranks_suite

from minipar.testing import harness
from minipar.testing.worker import load_suite

ALL_MPI = ranks_suite("reliability_all_mpi.py")  # bad input, debug, timeouts, mismatch, concurrency
EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
ALL_TORCH = ranks_suite("reliability_all_torch.py")  # the same but mismatch, on torch (gloo)
MISMATCH = ranks_suite("reliability_mismatch.py")
CONCURRENCY = ranks_suite("reliability_concurrency.py")


@pytest.mark.parametrize("size,name", harness.params(ALL_MPI, [1, 3]))
def test_reliability_mpi(size, name):
    harness.run_suite(ALL_MPI, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(ALL_TORCH, [2, 3] if EXTENDED else [2]))
def test_reliability_torch(size, name):
    harness.run_suite(ALL_TORCH, size, "torch").check(name)


@pytest.mark.parametrize("size,name", harness.params(MISMATCH, [2, 4]))  # 3: in ALL_MPI
def test_mismatch_is_loud_mpi(size, name):
    harness.run_suite(MISMATCH, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(CONCURRENCY, [4]))
def test_concurrency_mpi(size, name):
    harness.run_suite(CONCURRENCY, size, "mpi").check(name)


# -- one process, fresh interpreter ------------------------------------------------------------
def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **env},
    )


@pytest.mark.own_job
def test_before_init_and_after_finalize():
    done = run_python(
        """
        import numpy as np
        import minipar
        from minipar.errors import NotInitializedError

        def refused(call):
            try:
                call()
            except NotInitializedError as error:
                assert "call minipar.init() first" in str(error), error
            else:
                raise AssertionError("no NotInitializedError")

        x = np.ones(3)
        for call in (lambda: minipar.all_reduce(x), lambda: minipar.broadcast(x, 0),
                     minipar.get_rank, minipar.barrier, lambda: minipar.new_group([0])):
            refused(call)
        world = minipar.init()
        minipar.all_reduce(x)
        minipar.finalize()
        for call in (lambda: minipar.all_reduce(x), lambda: minipar.all_reduce(x, group=world),
                     minipar.get_world_size, lambda: minipar.new_group([0])):
            refused(call)
        minipar.init()  # and it starts again
        minipar.all_reduce(x)
        print("ok")
        """
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


@pytest.mark.own_job
def test_bad_settings():
    done = run_python(
        """
        import minipar
        from minipar.comm.transport.base import env_timeout
        for bad in (0, -1, "10", None.__class__):
            try:
                minipar.init(timeout=bad)
            except ValueError as error:
                assert "timeout must be a positive number of seconds" in str(error)
            else:
                raise AssertionError(bad)
        try:
            env_timeout()
        except ValueError as error:
            assert "MINIPAR_TIMEOUT must be a number of seconds, got 'soon'" in str(error)
        else:
            raise AssertionError("MINIPAR_TIMEOUT=soon accepted")
        print("ok")
        """,
        MINIPAR_TIMEOUT="soon",
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


@pytest.mark.own_job
def test_debug_from_environment():
    done = run_python(
        """
        import minipar
        from minipar import runtime
        minipar.init()
        assert runtime.debug_enabled()
        minipar.init(debug=False)
        assert not runtime.debug_enabled()
        print("ok")
        """,
        MINIPAR_DEBUG="1",
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


def test_errors_doc_lists_every_case():
    """docs/errors.md's bad-input table has a row for every case of the suite, and no other."""
    with open(os.path.join(ROOT, "docs", "errors.md")) as f:
        text = f.read()
    table = text[text.index("## Bad input") : text.index("### The rules behind the table")]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.M))
    suite = set(load_suite(ranks_suite("reliability.py")).BAD)
    assert documented == suite, (sorted(documented - suite), sorted(suite - documented))
