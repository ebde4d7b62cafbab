"""Fault injection: one rank misbehaves in the middle of a job; the job must still end, non-zero,
within the timeout, and its output must name the rank that misbehaved.

    MINIPAR_TIMEOUT=3 mpiexec -n 2 python tests/faults/inject.py MODE     # MPI transport
    MINIPAR_TIMEOUT=3 python tests/faults/inject.py MODE --torch 2        # torch (gloo), forked
    MINIPAR_TIMEOUT=3 python tests/faults/inject.py MODE --torch 2 --spawn  # ... spawned

Rank 1 is the faulty one. Modes:
  ok             nobody misbehaves: the control, it must exit 0
  raise_mid      raises inside a collective, between its two steps
  raise_between  raises between two collectives, while the others wait in the second
  sys_exit_mid   sys.exit(3) inside a collective
  sys_exit       sys.exit(3) instead of joining a collective
  os_exit_mid    os._exit(3) inside a collective (no Python cleanup at all)
  other_call     calls broadcast while the others call all_reduce
  other_count    calls all_reduce with twice the others' count
  leave_early    skips the rest of the job and exits 0 (the others' messages reach it first)
Issue 27's mistakes, made by every rank at once (each rank marks it), then a barrier (the
program goes on; `_last`: the script ends right after the mistake, and the exit must say it):
  own_root       broadcast of 8 floats, every rank passing itself as src
  dst            reduce of 8 floats, every rank passing itself as dst
  scatter_src    scatter, every rank passing itself as src (each keeps its own piece)
  other_group    all_reduce on a new group on rank 1, on the default group elsewhere
  own_root_last, scatter_src_last
  scatter_src_finalize  the script calls minipar.finalize() right after the mistake
Each rank that catches MismatchError prints "[fault] rank R MismatchError at T" and re-raises.
Add --debug to run with minipar's cross-rank checks (MINIPAR_DEBUG=1).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

FAULTY = 1
MODES = [
    "ok",
    "raise_mid",
    "raise_between",
    "sys_exit_mid",
    "sys_exit",
    "os_exit_mid",
    "other_call",
    "other_count",
    "leave_early",
]
MISTAKES = ["own_root", "dst", "scatter_src", "other_group", "own_root_last", "scatter_src_last"]
MISTAKES += ["scatter_src_finalize"]
MODES += MISTAKES


def mark(mode: str) -> None:
    """Tell the test when the fault happened (it measures how long the job took to end)."""
    print(f"[fault] rank {FAULTY} {mode} at {time.time():.3f}", file=sys.stderr, flush=True)


def misbehave(mode: str) -> None:
    mark(mode)
    if mode.startswith("raise"):
        raise RuntimeError(f"injected fault ({mode})")
    if mode.startswith("sys_exit"):
        sys.exit(3)
    if mode.startswith("os_exit"):
        os._exit(3)


def two_step_ring(mode: str):
    """A ring all-reduce-like algorithm of two steps; rank FAULTY misbehaves between them."""

    def algorithm(call, x, op):
        right, left = (call.rank + 1) % call.size, (call.rank - 1) % call.size
        for step in call.rounds(2):
            if step == 1 and call.rank == FAULTY and mode.endswith("_mid"):
                misbehave(mode)
            incoming = np.empty_like(x)
            call.sendrecv(x.copy(), right, incoming, left)

    algorithm.__name__ = "two_step_ring"
    return algorithm


def mistake(mode: str, world) -> None:
    """Issue 27's mistakes: every rank makes the call its own way, then the program goes on."""
    import minipar
    from minipar.errors import MismatchError

    r, p = world.rank, world.size
    other = minipar.new_group(list(range(p)), name="other") if mode == "other_group" else None
    world.barrier()
    print(f"[fault] rank {r} {mode} at {time.time():.3f}", file=sys.stderr, flush=True)
    try:
        if mode.startswith("own_root"):
            minipar.broadcast(np.ones(8, np.float32), r)
        elif mode == "dst":
            minipar.reduce(np.ones(8, np.float32), r)
        elif mode.startswith("scatter_src"):
            minipar.scatter(np.zeros(2), [np.full(2, float(r)) for _ in range(p)], r)
        else:
            minipar.all_reduce(np.ones(8), group=other if r == FAULTY else None)
        if mode.endswith("_last"):
            return  # the script ends here: the ranks compare their calls at exit
        if mode.endswith("_finalize"):
            minipar.finalize()  # the ranks compare their calls: it raises on every rank
        minipar.barrier()
    except MismatchError:
        print(f"[fault] rank {r} MismatchError at {time.time():.3f}", file=sys.stderr, flush=True)
        raise
    print(f"rank {r}: finished", flush=True)


def main(mode: str) -> None:
    import minipar

    world = minipar.init()
    r = world.rank
    x = np.full(8, float(r))
    minipar.all_reduce(x)  # a healthy first call: every rank is up and talking
    assert (x == sum(range(world.size))).all(), x
    if mode in MISTAKES:
        mistake(mode, world)
        return
    if r == FAULTY and mode in ("raise_between", "sys_exit"):
        misbehave(mode)
    if r == FAULTY and mode == "leave_early":
        mark(mode)
        from mpi4py import MPI

        # leave once rank 0's first message of the skipped call is here, however loaded the
        # machine: the leaving check must find it (without it, rank 0's timeout names rank 1)
        deadline = time.monotonic() + 10
        while not MPI.COMM_WORLD.Iprobe(0) and time.monotonic() < deadline:
            time.sleep(0.01)
        return
    if r == FAULTY and mode == "other_call":
        mark(mode)
        minipar.broadcast(x, 0)
    elif r == FAULTY and mode == "other_count":
        mark(mode)
        minipar.all_reduce(np.ones(16))
    elif mode.endswith("_mid"):
        minipar.all_reduce(x, algorithm=two_step_ring(mode))
    else:
        minipar.all_reduce(x)
    minipar.barrier()
    print(f"rank {r}: finished", flush=True)
    minipar.finalize()


def _spawned(rank: int, mode: str) -> None:
    main(mode)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--torch", type=int, metavar="N", help="spawn N ranks over gloo")
    parser.add_argument("--spawn", action="store_true", help="fresh interpreters, not forks")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args()
    if args.debug:
        os.environ["MINIPAR_DEBUG"] = "1"
    if args.torch is None:
        main(args.mode)
    else:
        from minipar.testing import spawn

        # forked from this process (torch loaded once), or torch.multiprocessing.spawn's fresh
        # interpreters (each imports torch again): both end through torch's ProcessContext
        spawn.spawn(_spawned, (args.mode,), args.torch, fork=not args.spawn)
