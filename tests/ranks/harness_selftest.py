"""Cases that fail on purpose, to test the harness itself (tests/test_harness.py)."""

import os

import numpy as np

import minipar


def fails_on_rank_0():
    w = minipar.init()
    if w.rank == 0:
        raise AssertionError("planted failure on rank 0")
    x = np.ones(3)
    minipar.all_reduce(x)  # rank 0 never joins: this rank times out


def works_after_failure():
    x = np.ones(3)
    minipar.all_reduce(x)
    assert (x == minipar.get_world_size()).all()


def crashes_rank_1():
    w = minipar.init()
    if w.rank == 1 and os.environ.get("MINIPAR_SELFTEST_CRASH") == "1":
        os._exit(3)


def cases(size):
    return {
        "fails_on_rank_0": fails_on_rank_0,
        "works_after_failure": works_after_failure,
        "crashes_rank_1": crashes_rank_1,
    }
