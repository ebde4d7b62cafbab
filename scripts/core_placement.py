"""Where the host put this VM's two cores, and what MPI's messages and sums cost there (the
numbers lessons/README.md, lessons/03_ring_and_tree.md and docs/bench.md state; a benchmark,
not a test). Run under minipar's launcher, once a placement:

    python -m minipar run -n 2 scripts/core_placement.py            # ping-pongs, copies, sums
    MPIR_CVAR_CH4_CMA_ENABLE=0 python -m minipar run -n 2 scripts/core_placement.py --big
                                                    # MPICH's cross-memory attach turned off
    python -m minipar run -n 4 scripts/core_placement.py --crossover # 4 ranks on 2 cores
    python -m minipar run -n 2 scripts/core_placement.py --coherence # sums after a peer read
    python -m minipar run -n 2 scripts/core_placement.py --rings     # the ring's fast forms

Rank 0 prints one line each: the one-way time of MPI ping-pongs (8 B to 16 MiB; touched
buffers, the fastest of 20), a 16 MiB copy on rank 0 alone and on both ranks at once (shared
cache: they contend), numpy's and MPICH's float32 sums (MPI.SUM.Reduce_local), and with
--crossover recursive doubling against the ring on every rank; with --coherence a float32 sum
into a buffer as a ring's reduce-scatter step finds it (the right neighbour has just read it
with an MPI message: its lines sit in the other core's cache) against the same sum on private
lines, numpy's and MPICH's, at sizes in and beyond the cache; with --rings the ring all-reduce
as routed (fast/scratch_sums.py up to 512 KiB chunks) against ring.py's own (ring@mpi) and
MPI_Allreduce, and 64 floats as a torch tensor against a numpy array (medians of 200 calls).
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import minipar

minipar.init()
c = MPI.COMM_WORLD
r = c.rank


def fastest(op, reps=20) -> float:
    op()
    best = float("inf")
    for _ in range(reps):
        c.Barrier()
        t0 = time.perf_counter()
        op()
        best = min(best, time.perf_counter() - t0)
    return max(c.allgather(best))


def one_way(n: int, reps: int = 20) -> float:
    buf, best = np.ones(n, np.uint8), float("inf")
    for _ in range(reps):
        c.Barrier()
        if r == 0:
            t0 = time.perf_counter()
            c.Send(buf, 1)
            c.Recv(buf, 1)
            best = min(best, (time.perf_counter() - t0) / 2)
        elif r == 1:
            c.Recv(buf, 0)
            c.Send(buf, 0)
    return c.bcast(best, root=0)


def per_call(algorithm: str, n: int, reps: int = 20) -> float:
    x = np.ones(max(n // 8, 1))
    minipar.all_reduce(x, algorithm=algorithm)
    best = float("inf")
    for _ in range(5):
        c.Barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            minipar.all_reduce(x, algorithm=algorithm)
        best = min(best, (time.perf_counter() - t0) / reps)
    return max(c.allgather(best))


def after_peer_read(n: int, by: str, peer_read: bool, reps: int = 40) -> float:
    """The fastest sum of n bytes into `mine` (the slowest rank's), each after the right
    neighbour read `mine` with a Sendrecv (peer_read) or after a Sendrecv of other buffers."""
    mine, received, other = (np.ones(n // 4, np.float32) for _ in range(3))
    right, left = (r + 1) % c.size, (r - 1) % c.size
    op = (lambda: MPI.SUM.Reduce_local(received, mine)) if by == "mpi" else (
        lambda: np.add(mine, received, out=mine))  # fmt: skip
    best = float("inf")
    for _ in range(reps):
        c.Sendrecv(mine if peer_read else other, right, 8, received, left, 8)
        c.Barrier()
        t0 = time.perf_counter()
        op()
        best = min(best, time.perf_counter() - t0)
    return max(c.allgather(best))


def median_call(op, reps=200) -> float:
    op()
    times = []
    for _ in range(reps):
        c.Barrier()
        t0 = time.perf_counter()
        op()
        times.append(max(c.allgather(time.perf_counter() - t0)))
    return float(np.median(times))


if "--rings" in sys.argv:
    import torch

    for n in (256 << 10, 1 << 20, 2 << 20):
        x = np.zeros(n // 4, np.float32)
        t = {a: median_call(lambda a=a, x=x: minipar.all_reduce(x, algorithm=a))
             for a in ("ring", "ring@mpi")}  # fmt: skip
        t["MPI"] = median_call(lambda x=x: c.Allreduce(MPI.IN_PLACE, x))
        if r == 0:
            print(f"{n >> 10} KiB all-reduce, median: " + ", ".join(
                f"{k} {v * 1e6:.0f} us" for k, v in t.items()), flush=True)  # fmt: skip
    small = {"torch": torch.zeros(64), "numpy": np.zeros(64, np.float32)}
    t = {
        k: median_call(lambda v=v: minipar.all_reduce(v, algorithm="ring"))
        for k, v in small.items()
    }
    if r == 0:
        print(f"64 floats, ring: torch tensor {t['torch'] * 1e6:.1f} us, numpy array "
              f"{t['numpy'] * 1e6:.1f} us", flush=True)  # fmt: skip
    sys.exit(0)
if "--coherence" in sys.argv:
    for n in (128 << 10, 512 << 10, 4 << 20):
        t = {(by, seen): after_peer_read(n, by, seen) for by in ("numpy", "mpi")
             for seen in (False, True)}  # fmt: skip
        if r == 0:
            print(
                f"{n >> 10} KiB float32 sum: numpy {t['numpy', False] * 1e6:.1f} us on private "
                f"lines, {t['numpy', True] * 1e6:.1f} us after the neighbour read them; MPICH "
                f"{t['mpi', False] * 1e6:.1f} / {t['mpi', True] * 1e6:.1f} us",
                flush=True,
            )
    sys.exit(0)
if "--crossover" in sys.argv:
    for n in (8, 1 << 10, 16 << 10, 64 << 10):
        rd, ring = per_call("recursive_doubling", n), per_call("ring", n)
        if r == 0:
            print(f"{c.size} ranks, {n} B: recursive doubling {rd * 1e6:.0f} us, ring "
                  f"{ring * 1e6:.0f} us", flush=True)  # fmt: skip
    sys.exit(0)
sizes = [16 << 20] if "--big" in sys.argv else [8, 64 << 10, 1 << 20, 16 << 20]
pp = {n: one_way(n, 5 if "--big" in sys.argv else 20) for n in sizes}
line = "one way: " + ", ".join(f"{n} B {t * 1e6:.1f} us" for n, t in pp.items())
if "--big" not in sys.argv:
    a, b = np.ones(16 << 20, np.uint8), np.empty(16 << 20, np.uint8)
    np.copyto(b, a)
    solo = fastest(lambda: np.copyto(b, a) if r == 0 else None)
    both = fastest(lambda: np.copyto(b, a))
    f, g = np.ones(1 << 20, np.float32), np.ones(1 << 20, np.float32)
    add = fastest(lambda: np.add(f, g, out=g))
    mpi_sum = fastest(lambda: MPI.SUM.Reduce_local(f, g))
    line += (f"; 16 MiB copy on rank 0 alone {solo * 1e3:.2f} ms, on both at once "
             f"{both * 1e3:.2f} ms; 4 MiB float32 sum: numpy {4 * 2**20 / add / 1e9:.1f} GB/s, "
             f"MPICH {4 * 2**20 / mpi_sum / 1e9:.1f} GB/s")  # fmt: skip
if r == 0:
    print(line, flush=True)
