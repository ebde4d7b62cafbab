"""What a batch leaves behind for the next one on the same warm job (tests/test_harness.py):
its groups (freed at the end of the batch) with their shared windows (buffers from
minipar.empty included), and the algorithms it registered."""

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


def window_buffers():
    """Groups that each hold a 4 MiB buffer in a shared window (minipar.empty), kept until the
    batch ends; the test compares the shared mappings it prints (MPI; nothing on one rank)."""
    w = minipar.init()
    print("shared mappings", shared_mappings(), flush=True)
    START["buffers"] = []
    for _ in range(8):
        g = minipar.new_group(list(range(w.size)))
        x = minipar.empty((1 << 20,), "float32", group=g)
        x[:] = 1.0
        minipar.all_reduce(x, group=g)
        assert (x == w.size).all()
        START["buffers"].append((g, x))


def shared_mappings() -> int:
    """This process's memory mappings of shared-memory files (MPICH's shared windows)."""
    with open("/proc/self/maps") as f:
        return sum("/dev/shm" in line or "(deleted)" in line for line in f)


def registers_an_algorithm():
    assert "selftest_copy" not in minipar.algorithms("all_reduce"), "left by an earlier batch"
    minipar.register_algorithm("all_reduce", "selftest_copy", lambda call, x, op: None)


def cases(size):
    return {
        "many_groups": many_groups,
        "window_buffers": window_buffers,
        "registers_an_algorithm": registers_an_algorithm,
    }
