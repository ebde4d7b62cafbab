"""The multi-rank harness reports failures from every rank, recovers after a failed case, and
turns a crashed job into failures rather than a hang."""

import os

import pytest
from conftest import ranks_suite

from minipar.testing import harness

SUITE = ranks_suite("harness_selftest.py")


def test_failure_names_rank_and_others_time_out(monkeypatch):
    monkeypatch.setenv("MINIPAR_TIMEOUT", "2")
    result = harness.run_suite.__wrapped__(SUITE, 2, "mpi")
    with pytest.raises(AssertionError) as failed:
        result.check("fails_on_rank_0")
    text = str(failed.value)
    assert "--- rank 0 ---" in text and "planted failure on rank 0" in text
    assert "--- rank 1 ---" in text and "CommTimeoutError" in text and "all_reduce" in text
    result.check("works_after_failure")  # the ranks were realigned after the failure


def test_crashed_job_reports_missing_ranks(monkeypatch):
    monkeypatch.setenv("MINIPAR_TIMEOUT", "2")
    monkeypatch.setenv("MINIPAR_SELFTEST_CRASH", "1")
    result = harness.run_suite.__wrapped__(SUITE, 2, "mpi", timeout=60)
    assert result.returncode != 0
    with pytest.raises(AssertionError, match=r"no result from ranks \[.*1.*\]"):
        result.check("crashes_rank_1")
    assert os.path.basename(SUITE) in result.suite
