"""What a batch leaves behind for the next one on the same warm job (tests/test_harness.py):
its groups (freed at the end of the batch) and the algorithms it registered."""

import os

import numpy as np

import minipar

START = {}


def many_groups():
    """Groups kept until the batch ends: on MPI 1,500, so that two batches in a row exceed
    MPICH's 2,048 communicators unless the first batch's were freed; on gloo (a group costs
    sockets and a rendezvous) 30, and the test compares the open descriptors it prints."""
    w = minipar.init()
    print("open descriptors", len(os.listdir("/proc/self/fd")), flush=True)
    count = 1500 if minipar.get_backend() == "mpi" else 30
    START["groups"] = [minipar.new_group(list(range(w.size))) for _ in range(count)]
    x = np.ones(2)
    minipar.all_reduce(x, group=START["groups"][-1])
    assert (x == w.size).all()


def registers_an_algorithm():
    assert "selftest_copy" not in minipar.algorithms("all_reduce"), "left by an earlier batch"
    minipar.register_algorithm("all_reduce", "selftest_copy", lambda call, x, op: None)


def cases(size):
    return {"many_groups": many_groups, "registers_an_algorithm": registers_an_algorithm}
