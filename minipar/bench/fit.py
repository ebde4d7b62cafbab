"""`minipar bench --fit`: this machine's alpha, beta and gamma, measured through minipar itself.

    alpha   half the round trip of an 8-byte ping-pong between ranks 0 and 1 (comm.send/recv)
    beta    per byte of a two-way exchange (comm.sendrecv), fitted to exchanges of 1 to 64 MiB so
            that the relative error is smallest over that range (`relative_slope`): every step
            of a ring or butterfly sends and receives at once, and on shared memory the same
            core does both copies, so a one-way ping-pong would flatter the link
    gamma   seconds per byte of `np.add(a, b, out=a)` on 64 MiB, every rank at once

Each is the fastest of several repetitions (on a shared machine the slow ones measure someone
else's load). The one-way large-message bandwidth is stored beside them, for comparison.
Ranks other than 0 and 1 wait at the barriers while the pair measures.
"""

from __future__ import annotations

import datetime
import os
import socket
import time

SMALL, LARGE = 16 << 20, 64 << 20  # beyond the caches: collectives stream from memory


def _pair_times(comm, timer, nbytes: int, iters: int, exchange: bool) -> float:
    """Seconds per message (ping-pong: half a round trip; exchange: one sendrecv), the fastest
    repetition: what the link can do, not what other processes' load left of it."""
    import numpy as np

    out, back = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    me, times = comm.rank, []
    for _ in range(iters):
        timer.barrier()
        start = time.perf_counter()
        if me in (0, 1) and exchange:
            comm.sendrecv(out, 1 - me, back, 1 - me)
        elif me == 0:
            comm.send(out, 1)
            comm.recv(back, 1)
        elif me == 1:
            comm.recv(back, 0)
            comm.send(back, 0)
        times.append((time.perf_counter() - start) / (1 if exchange else 2))
    mine = min(times) if me in (0, 1) else 0.0
    return timer.max_over_ranks(mine)


def relative_slope(sizes, times, alpha: float) -> float:
    """beta minimising the sum of ((alpha + n beta - t) / t)^2 over the measured (n, t): the fit
    that keeps the *relative* error small at every size, which is what a prediction's reader
    judges it by, where a plain least squares would serve the largest sizes and a two-point
    slope two sizes only. Closed form: beta = sum(n (t - alpha) / t^2) / sum(n^2 / t^2)."""
    num = sum(n * (t - alpha) / t**2 for n, t in zip(sizes, times))
    den = sum(n * n / t**2 for n, t in zip(sizes, times))
    return max(num / den, 1e-13)


def _reduce_rate(timer, nbytes: int) -> float:
    from minipar import roofline

    _, add_rate = roofline.kernel_rates(nbytes, "float32", timer.barrier, timer.max_over_ranks)
    return add_rate


def measure(comm, timer) -> dict:
    """alpha, beta, gamma (seconds, s/byte, s/byte) and the raw measurements, on every rank."""
    if comm.size < 2:
        raise ValueError("--fit needs at least 2 ranks (it times messages between two of them)")
    alpha = _pair_times(comm, timer, 8, 500, exchange=False)
    sizes = [1 << k for k in range(20, 27)]  # 1 MiB .. 64 MiB, where the model must hold
    times = [_pair_times(comm, timer, n, max(3, (16 << 20) // n), exchange=True) for n in sizes]
    one_way = _pair_times(comm, timer, LARGE, 5, exchange=False)
    beta = relative_slope(sizes, times, alpha)
    add_rate = _reduce_rate(timer, LARGE)
    return {
        "alpha": alpha,
        "beta": beta,
        "gamma": 1 / add_rate,
        "exchange_GBps": 1 / beta / 1e9,
        "one_way_GBps": LARGE / one_way / 1e9,
        "reduce_GBps": add_rate / 1e9,
        "host": socket.gethostname(),
        "ranks": comm.size,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def measure_shm(comm, timer) -> dict | None:
    """The shared windows' link (comm/shm.py), fitted to `ring@shm` all-reduces of 8 B (three
    waits: alpha) and of SMALL and LARGE (the slope, less the reduction at gamma, spread over the
    bytes the schedule copies: beta); None when this group cannot share memory."""
    import numpy as np

    import minipar
    from minipar import cost
    from minipar.comm import shm

    if shm.node_of(comm, "bench --fit") is None:
        return None

    def fastest(nbytes: int, iters: int) -> float:
        x = np.ones(max(1, nbytes // 4), np.float32)
        minipar.all_reduce(x, algorithm="ring@shm")  # the window grows here, not in the timing
        times = []
        for _ in range(iters):
            timer.barrier()
            start = time.perf_counter()
            minipar.all_reduce(x, algorithm="ring@shm")
            times.append(time.perf_counter() - start)
        return timer.max_over_ranks(min(times))

    tiny, small, large = fastest(8, 200), fastest(SMALL, 5), fastest(LARGE, 3)
    per_byte = max((large - small) / (LARGE - SMALL), 1e-13)
    t = cost.shm_traffic("all_reduce", 1.0, comm.size)  # bytes copied / reduced per byte
    gamma = 1 / _reduce_rate(timer, LARGE)
    beta = max((per_byte - t.bytes_reduced * gamma) / t.bytes_sent, 1e-13)
    return {"shm_alpha": tiny / t.steps, "shm_beta": beta, "shm_gamma": gamma}


def as_shm_link(fit: dict):
    from minipar import cost

    source = f"minipar bench --fit (shared windows), {fit['ranks']} ranks on {fit['host']}"
    name = f"fitted-shm:{fit['host']}"
    return cost.Link(name, fit["shm_alpha"], fit["shm_beta"], fit["shm_gamma"], source)


def shm_path(path: str) -> str:
    """Where --fit stores the windows' link: beside the MPI link's file."""
    root, ext = os.path.splitext(path)
    return f"{root}-shm{ext or '.json'}"


def as_link(fit: dict):
    from minipar import cost

    source = f"minipar bench --fit, {fit['ranks']} ranks on {fit['host']}, {fit['date']}"
    return cost.Link(f"fitted:{fit['host']}", fit["alpha"], fit["beta"], fit["gamma"], source)


def measured_crossover(rows, small: str, large: str):
    """The smallest size from which `large` is faster than `small` at every size measured
    (all_reduce minipar rows), or None when it never is; "below" when it always is."""
    times = {}
    for r in rows:
        if r["collective"] == "all_reduce" and r["implementation"] == "minipar":
            times.setdefault(r["nbytes"], {})[r["algorithm"]] = r["time_s_median"]
    sizes = sorted(n for n, t in times.items() if small in t and large in t)
    wins = [times[n][large] < times[n][small] for n in sizes]
    if not sizes or not wins[-1]:
        return None
    first = len(wins)
    while first > 0 and wins[first - 1]:
        first -= 1
    return "below" if first == 0 else sizes[first]
