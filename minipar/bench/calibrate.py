"""`minipar calibrate`'s ranks: this machine measured once, stored for every lesson to use.

    minipar calibrate                     # python -m minipar.bench.calibrate on 2 ranks
    minipar calibrate --nodes 2           # and the emulated link between 2 nodes, at its rate

What is measured and how (minipar/cost/calibration.py stores it):

    links     one-way times (half a ping-pong round trip, the fastest of the repeats) of
              minipar's messages at 8 B .. 4 MiB between rank 0 and a rank of its node ("mpi"),
              and of a rank on another node ("emulated", when there is one); the shared windows'
              ring all-reduce at 8 B .. 4 MiB ("shm": its waits and bytes copied, the reduction
              taken off at gamma). alpha and beta by least squares; alpha < 0 is refused.
    step_s    minipar's ring all-reduce of 8 B, per step, less a bare MPI message (mpi4py's
              Send/Recv of 8 B): what minipar's own Python adds to every step
    gamma, copy_Bps   cost.roofline.kernel_rates on 32 MiB: numpy's add and copy, every rank at
              once, the fastest run: THE memory-copy bandwidth every lesson uses (copy_rates)
    matmul_flops      the tiny GPT's MLP matmul (batch 8 x seq 64 tokens, hidden -> 4 hidden),
              float32 on the CPU, every rank at once, the fastest run

Rank 0 writes the record (host, date, minipar version, cores, load average before and during).
"""

from __future__ import annotations

import os
import socket
import time

import numpy as np

import minipar
from minipar import cost, launcher
from minipar.comm.transport import shm
from minipar.cost import calibration, roofline
from minipar.models.config import GPTConfig

LINK_SIZES = [8, 4 << 10, 64 << 10, 1 << 20, 4 << 20]
COPY_BYTES = 32 << 20  # beyond the caches: the copy streams from memory
LINK_ENV = cost.EMULATED_LINK_ENV  # the emulated link's rate, set by the launcher with --nodes
LOAD_ENV = "MINIPAR_LOAD_BEFORE"


def copy_rates(comm, nbytes: int = COPY_BYTES, min_seconds: float = 0.02) -> tuple[float, float]:
    """(copy, add) bytes/s: numpy's copy and add of nbytes, every rank at once, the fastest
    run (cost.roofline.kernel_rates). The one way every lesson measures memory bandwidth."""
    return roofline.kernel_rates(
        nbytes, "float32", comm.barrier, lambda t: max(comm.allgather_object(t)), min_seconds
    )


def one_way(comm, nbytes: int, reps: int, a: int, b: int, raw: bool = False) -> float:
    """The fastest one-way time (half a round trip) of nbytes from rank a to rank b and back,
    known on every rank; raw: mpi4py's Send/Recv instead of minipar's transport, on a duplicate
    of the communicator (collective: every rank calls one_way): mpi4py's Recv takes any tag, and
    on minipar's own communicator it would take a message of minipar's (MPI: "Message
    truncated")."""

    buf = np.zeros(max(nbytes, 1), np.uint8)
    own = comm.mpi.Dup() if raw else None
    try:
        return _one_way(comm, buf, reps, a, b, (own.Send, own.Recv) if raw else None)
    finally:
        if own is not None:
            own.Free()


def _one_way(comm, buf, reps: int, a: int, b: int, raw) -> float:
    send, recv = raw or (comm.send, comm.recv)
    best = float("inf")
    comm.barrier()
    for _ in range(reps):
        if comm.rank == a:
            t0 = time.perf_counter()
            send(buf, b)
            recv(buf, b)
            best = min(best, (time.perf_counter() - t0) / 2)
        elif comm.rank == b:
            recv(buf, a)
            send(buf, a)
    return comm.allgather_object(best)[a]


def link_sweep(comm, a: int, b: int, sizes=LINK_SIZES) -> calibration.LinkFit:
    """alpha, beta of the link between ranks a and b, fitted to one-way times at `sizes`."""
    times = [one_way(comm, n, 100 if n <= 64 << 10 else 10, a, b) for n in sizes]
    return calibration.fit_link([1] * len(sizes), sizes, times), times


def all_reduce_time(comm, nbytes: int, reps: int, algorithm: str, typical=True) -> float:
    """The median (typical) or the fastest over reps of the slowest rank's time of one
    all-reduce (after one untimed)."""

    x = np.zeros(max(1, nbytes // 4), np.float32)
    minipar.all_reduce(x, algorithm=algorithm)
    times = []
    for _ in range(reps):
        comm.barrier()
        t0 = time.perf_counter()
        minipar.all_reduce(x, algorithm=algorithm)
        times.append(max(comm.allgather_object(time.perf_counter() - t0)))
    return sorted(times)[len(times) // 2 if typical else 0]


def shm_fit(comm, gamma: float):
    """The shared windows' alpha, beta: their ring all-reduce at LINK_SIZES, the bytes reduced
    priced at gamma and taken off, the rest fitted on waits (steps) and bytes copied. None when
    this group cannot share memory (it spans nodes)."""

    if shm.node_of(comm, "minipar calibrate") is None:
        return None
    steps, copied, rest = [], [], []
    for n in LINK_SIZES:
        t = all_reduce_time(comm, n, 20 if n <= 64 << 10 else 5, "ring@shm")
        traffic = cost.shm_traffic("all_reduce", n, comm.size)
        steps.append(traffic.steps)
        copied.append(traffic.bytes_sent)
        rest.append(max(t - traffic.bytes_reduced * gamma, 1e-9))
    return calibration.fit_link(steps, copied, rest)


def step_cost(comm) -> tuple[float, float]:
    """(minipar's Python per step, a bare MPI message's one-way time), seconds: the ring
    all-reduce of 8 B per step less the bare message."""
    bare = one_way(comm, 8, 200, 0, 1, raw=True)
    steps = cost.traffic("all_reduce", "ring", 8, comm.size).steps
    # the fastest, as the bare message's: what the code costs, not what the load left of it
    per_step = all_reduce_time(comm, 8, 50, "ring@mpi", typical=False) / steps
    return max(per_step - bare, 0.0), bare


def matmul_rate(comm, reps: int = 20) -> float:
    """FLOP/s of the tiny GPT's MLP matmul, every rank at once, the fastest run."""

    # here, not at the top of the file: torch loads only when used
    import torch

    config = GPTConfig()
    tokens = 8 * config.seq_len
    a, w = torch.randn(tokens, config.hidden), torch.randn(config.hidden, config.ffn)
    torch.matmul(a, w)
    best = float("inf")
    for _ in range(reps):
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(10):
            torch.matmul(a, w)
        best = min(best, max(comm.allgather_object(time.perf_counter() - t0)) / 10)
    return 2 * tokens * config.hidden * config.ffn / best


def peers(comm) -> tuple[int | None, int | None]:
    """(a rank on rank 0's node, a rank on another node), None where there is none."""
    owner = minipar.node_map(comm)
    inside = next((r for r in range(1, comm.size) if owner[r] == owner[0]), None)
    across = next((r for r in range(1, comm.size) if owner[r] != owner[0]), None)
    return inside, across


def measure(comm) -> dict:
    """The calibration record (every rank computes it; rank 0's is stored)."""
    if comm.size < 2:
        raise ValueError("minipar calibrate needs at least 2 ranks (it times messages)")
    started = time.time()
    copy, add = copy_rates(comm)
    inside, across = peers(comm)
    links, sweeps = {}, {}
    if inside is not None:
        fit, sweeps["mpi"] = link_sweep(comm, 0, inside)
        links["mpi"] = calibration.link_record(fit)
    shm = shm_fit(comm, 1 / add)
    if shm is not None:
        links["shm"] = calibration.link_record(shm)
    if across is not None:
        fit, sweeps["emulated"] = link_sweep(comm, 0, across)
        bits = os.environ.get(LINK_ENV)
        links["emulated"] = calibration.link_record(fit, rate_bits=float(bits) if bits else None)
    step, bare = step_cost(comm) if inside == 1 else (None, None)
    load_now = max(0.0, os.getloadavg()[0] - comm.size)
    return {
        "host": socket.gethostname(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "time": time.time(),
        "minipar": minipar.__version__,
        **calibration.provenance(),  # which environment and checkout: the file is per user
        "cores": launcher.cores(),
        "ranks": comm.size,
        "load": {"before": float(os.environ.get(LOAD_ENV) or load_now), "during": load_now},
        "links": links,
        "sweeps": {k: dict(zip(map(str, LINK_SIZES), v)) for k, v in sweeps.items()},
        "step_s": step,
        "bare_message_s": bare,
        "gamma": 1 / add,
        "copy_Bps": copy,
        "matmul_flops": matmul_rate(comm),
        "seconds": time.time() - started,
    }


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m minipar.bench.calibrate")
    parser.add_argument("--out", default=None, help="the file (default: calibration.path())")
    args = parser.parse_args(argv)
    comm = minipar.init()
    record = measure(comm)
    if comm.rank == 0:
        where = calibration.save(record, args.out)
        print(f"calibration stored in {where} ({record['seconds']:.0f} s)")
    minipar.finalize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
