"""Cases that break a warm job on purpose, to test the pool's guarantees (tests/test_harness.py):
a case that hangs, one that kills a rank (exit, segfault, MPI_Abort), one that leaves state
behind (minipar's process state included), one that makes a collective call the other ranks do
not, one where every rank is its own broadcast's root (as many calls, not the same ones: only
the history in the tags shows it). Each breaking case is gated by MINIPAR_SELFTEST_BREAK (set
per batch by the test) so that the same names list both."""

import ctypes
import os
import time

import numpy as np
import torch

import minipar
from minipar import cost, ledger, runtime
from minipar.course import stepdiff
from minipar.parallel.activation_memory import ActivationMemory
from minipar.state import process

BREAK = os.environ.get("MINIPAR_SELFTEST_BREAK", "")
# seconds: a hung case here fails fast (the pool's default is larger); a batch that hangs on
# purpose holds only quick cases, the others wait out MINIPAR_TIMEOUT=2 s in theirs
CASE_LIMIT = 3 if BREAK == "hang" else 6
START = {}  # what the first case saw, compared by the second (same batch, same module)


def works():
    x = np.ones(3)
    minipar.all_reduce(x)
    assert (x == minipar.get_world_size()).all(), x


def hangs(ranks):
    def case():
        w = minipar.init()
        print(f"rank {w.rank} is about to hang" if w.rank in ranks else "fine here", flush=True)
        if BREAK == "hang" and w.rank in ranks:
            time.sleep(600)

    return case


def dies(how):
    def case():
        w = minipar.init()
        print(f"rank {w.rank} before {how}", flush=True)
        if BREAK != how or w.rank != w.size - 1:
            return
        # the job ends once a rank dies (mpiexec kills the rest): let the others' results of
        # this case reach pytest first, since the test checks that only the dead rank is named
        time.sleep(1.0)
        if how == "exit":
            os._exit(3)
        if how == "segfault":
            ctypes.string_at(0)
        if how == "abort":
            w.abort(7)

    return case


def leaves_state():
    """Leave behind everything a case should not: the next case checks it was undone."""
    START["rand"] = torch.rand(3).tolist()
    START["np"] = np.random.random(3).tolist()
    START["env"] = dict(os.environ)
    START["cwd"] = os.getcwd()
    os.environ["MINIPAR_SELFTEST_LEFT"] = "1"
    os.environ.pop("MINIPAR_TIMEOUT")
    os.chdir(os.path.dirname(os.getcwd()))
    START["link"] = cost.default_link()
    START["mismatch_after"] = process.mismatch_after
    ledger.trace().__enter__()  # never closed
    stepdiff.explaining().__enter__()  # nor this recording, nor the memory counter
    ActivationMemory().__enter__()
    cost.set_default_link(cost.IB_NDR)
    minipar.init(debug=True, timeout=99, fast_paths=False, mismatch_after=0.3)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.manual_seed(123)
    np.random.seed(5)
    minipar.new_group(list(range(minipar.get_world_size())), name="left_behind")


def sees_clean_state():
    assert os.environ == START["env"], set(os.environ.items()) ^ set(START["env"].items())
    assert os.getcwd() == START["cwd"], os.getcwd()
    assert not ledger.active(), "a trace block is still open"
    assert not process.explaining and not process.memory_counters, "a recording is still open"
    assert not runtime.debug_enabled(), "debug mode is still on"
    assert process.fast_paths, "the fast paths are still switched off"
    assert process.mismatch_after == START["mismatch_after"], process.mismatch_after
    assert cost.default_link() is START["link"], cost.default_link()
    assert minipar.init().timeout == float(os.environ["MINIPAR_TIMEOUT"]), minipar.init().timeout
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    draws = torch.rand(3).tolist()
    assert draws == START["rand"], "torch's generator was not reset"
    assert np.random.random(3).tolist() == START["np"], "numpy's generator was not reset"
    everyone = [None] * minipar.get_world_size()
    minipar.all_gather_object(everyone, draws)
    assert all(d == draws for d in everyone), f"ranks draw differently: {everyone}"
    works()


def skips_a_call():
    """Rank 0 makes a broadcast the others never make: it returns (its send is small enough to
    go eagerly), every rank passes, and only the call counters show it."""
    w = minipar.init()
    if BREAK == "skip" and w.rank == 0:
        minipar.broadcast(np.ones(1), src=0)


def two_roots():
    """Every rank broadcasts as its own root: each only sends (small messages go eagerly) and
    returns, as many calls on every rank, and only the history in the tags tells them apart."""
    w = minipar.init()
    minipar.broadcast(np.ones(1), src=w.rank if BREAK == "roots" else 0)


def fails_with_output():
    w = minipar.init()
    print(f"rank {w.rank} says hello before failing", flush=True)
    raise AssertionError(f"planted failure on rank {w.rank}")


def sees_batch_env():
    """The pytest process's environment reaches the ranks with each batch."""
    value = os.environ.get("MINIPAR_SELFTEST_VALUE")
    assert value == f"value-{BREAK}", value


def cases(size):
    return {
        "works": works,
        "hangs_on_last_rank": hangs({size - 1}),
        "works_after_hang": works,
        "hangs_everywhere": hangs(set(range(size))),
        "works_after_hang_everywhere": works,
        "exits": dies("exit"),
        "works_after_exit": works,
        "segfaults": dies("segfault"),
        "works_after_segfault": works,
        "aborts": dies("abort"),
        "works_after_abort": works,
        "leaves_state": leaves_state,
        "sees_clean_state": sees_clean_state,
        "skips_a_call": skips_a_call,
        "works_after_skip": works,
        "two_roots": two_roots,
        "works_after_roots": works,
        "fails_with_output": fails_with_output,
        "sees_batch_env": sees_batch_env,
    }
