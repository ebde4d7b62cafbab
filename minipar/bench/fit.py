"""`minipar bench --fit`: this machine's alpha, beta and gamma, measured through minipar itself.

    alpha,  per step and per byte sent, fitted together to the transport's own ring all-reduce of
    beta    1 to 64 MiB (gamma held fixed) so that the relative error is smallest over that range
            (`relative_line`): a ring step sends and receives at once, copies into and out of
            the transport's buffers, shares the memory bus with the reduction and pays the
            collective's Python per step, which a bare exchange or ping-pong would not show
            (both are reported beside it: `ping_pong_alpha`, `exchange_GBps`)
    gamma   seconds per byte of `np.add(a, b, out=a)` on 64 MiB, every rank at once

Each is the fastest of several repetitions (on a shared machine the slow ones measure someone
else's load). The one-way large-message bandwidth is stored beside them, for comparison.
Ranks other than 0 and 1 wait at the barriers while the pair measures.

On a job that spans nodes of equal size there are two links, fitted apart: the in-node link
as above on the ranks of node 0 (its ring never leaves the node), and the between-node link
(`inter_alpha`, `inter_beta`: `measure_between_nodes`) on one rank a node, whose ring crosses
between nodes at every step; a ping-pong between node 0 and node 1 is reported beside it.
"""

from __future__ import annotations

import datetime
import os
import socket
import time

import minipar
from minipar import cost
from minipar.cost import roofline

SMALL, LARGE = 16 << 20, 64 << 20  # beyond the caches: collectives stream from memory
FIT_SIZES = [1 << k for k in range(20, 27)]  # 1 MiB .. 64 MiB: where the model must hold


def _pair_times(comm, timer, nbytes: int, iters: int, exchange: bool, pair=(0, 1)) -> float:
    """Seconds per message (ping-pong: half a round trip; exchange: one sendrecv) between the
    ranks `pair`, the fastest repetition: what the link can do, not what other processes' load
    left of it."""
    import numpy as np

    out, back = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    me, times = comm.rank, []
    a, b = pair
    for _ in range(iters):
        timer.barrier()
        start = time.perf_counter()
        if me in pair and exchange:
            other = b if me == a else a
            comm.sendrecv(out, other, back, other)
        elif me == a:
            comm.send(out, b)
            comm.recv(back, b)
        elif me == b:
            comm.recv(back, a)
            comm.send(back, a)
        times.append((time.perf_counter() - start) / (1 if exchange else 2))
    mine = min(times) if me in pair else 0.0
    return timer.max_over_ranks(mine)


def relative_slope(sizes, times, alpha) -> float:
    """beta minimising the sum of ((a + n beta - t) / t)^2 over the measured (n, t), where `a`
    (alpha: one number, or one per point) is the part of each time the model already explains.
    This keeps the *relative* error small at every size, which is what a prediction's reader
    judges it by; a plain least squares would serve the largest sizes and a two-point slope
    two sizes only. Closed form: beta = sum(n (t - a) / t^2) / sum(n^2 / t^2)."""
    offsets = alpha if isinstance(alpha, (list, tuple)) else [alpha] * len(sizes)
    num = sum(n * (t - a) / t**2 for n, t, a in zip(sizes, times, offsets))
    den = sum(n * n / t**2 for n, t in zip(sizes, times))
    return max(num / den, 1e-13)


def _all_reduce_time(
    timer, algorithm: str, nbytes: int, iters: int, typical=True, group=None, member=True
) -> float:
    """The median (typical=True) or the fastest of `iters` minipar all-reduces of nbytes
    (float32), each iteration timed as bench times a row's: from a barrier, the slowest rank's
    time. The median is what bench's rows report and the model is judged against. With
    `group`, its members (`member`) all-reduce over it while the others wait at the barriers."""
    import numpy as np

    x = np.ones(max(1, nbytes // 4), np.float32)
    if member:
        minipar.all_reduce(x, group=group, algorithm=algorithm)  # scratch grows here, untimed
    times = []
    for _ in range(iters):
        timer.barrier()
        start = time.perf_counter()
        if member:
            minipar.all_reduce(x, group=group, algorithm=algorithm)
        times.append(timer.max_over_ranks(time.perf_counter() - start))
    times.sort()
    return times[len(times) // 2] if typical else times[0]


def relative_line(steps, sent, times, known) -> tuple[float, float]:
    """(alpha, beta) minimising the sum of ((steps alpha + sent beta + known - t) / t)^2: the
    two-parameter form of relative_slope (a 2 x 2 linear system)."""
    u = [k / t for k, t in zip(steps, times)]
    v = [n / t for n, t in zip(sent, times)]
    w = [(t - c) / t for t, c in zip(times, known)]
    uu, uv, vv = sum(a * a for a in u), sum(a * b for a, b in zip(u, v)), sum(b * b for b in v)
    uw, vw = sum(a * c for a, c in zip(u, w)), sum(b * c for b, c in zip(v, w))
    det = uu * vv - uv * uv
    if det <= 0:
        return 0.0, relative_slope(sent, times, known)
    return (uw * vv - vw * uv) / det, (uu * vw - uv * uw) / det


def fit_ring(
    comm, timer, algorithm: str, traffic, alpha: float, gamma: float, group=None, member=True
):
    """(alpha, beta) of a transport, fitted to its own ring all-reduce at FIT_SIZES: what a step
    and a byte sent cost in the algorithm the model prices (the collective's per-step Python,
    copies into and out of the transport, the memory bus shared with the reduction), gamma
    fixed from its own measurement. `traffic(n)` gives the ring's steps and bytes on this
    transport (cost.traffic or cost.shm_traffic). `alpha`, the bare message latency, is kept
    if the fitted one comes out smaller (a noisy run), and beta refitted with it."""
    times, steps, sent, known = [], [], [], []
    for n in FIT_SIZES:
        times.append(_all_reduce_time(timer, algorithm, n, max(5, LARGE // n), True, group, member))
        t = traffic(n)
        steps.append(t.steps)
        sent.append(t.bytes_sent)
        known.append((t.bytes_reduced + t.bytes_copied) * gamma)
    fitted_alpha, beta = relative_line(steps, sent, times, known)
    if fitted_alpha < alpha or beta <= 0:
        fitted_alpha = alpha
        beta = relative_slope(sent, times, [k * alpha + c for k, c in zip(steps, known)])
    return fitted_alpha, beta


def _reduce_rate(timer, nbytes: int) -> float:
    _, add_rate = roofline.kernel_rates(nbytes, "float32", timer.barrier, timer.max_over_ranks)
    return add_rate


def measure(comm, timer) -> dict:
    """alpha, beta, gamma (seconds, s/byte, s/byte) and the raw measurements, on every rank."""
    if comm.size < 2:
        raise ValueError("--fit needs at least 2 ranks (it times messages between two of them)")

    by_node = _by_node(comm)
    inside = None  # the ring the in-node link is fitted on: the world, or node 0's ranks
    if len(by_node) > 1 and len(by_node[0]) > 1:
        inside = minipar.new_group(by_node[0])  # collective: every rank makes it
    alpha = _pair_times(comm, timer, 8, 500, exchange=False)
    small = _pair_times(comm, timer, SMALL, 10, exchange=True)
    large = _pair_times(comm, timer, LARGE, 5, exchange=True)
    one_way = _pair_times(comm, timer, LARGE, 5, exchange=False)
    add_rate = _reduce_rate(timer, LARGE)
    p = len(by_node[0]) if inside is not None else comm.size
    ring_alpha, beta = fit_ring(
        comm, timer, "ring@mpi", lambda n: cost.traffic("all_reduce", "ring", n, p), alpha,
        1 / add_rate, inside, inside is None or comm.rank in by_node[0],
    )  # fmt: skip
    between = measure_between_nodes(comm, timer, 1 / add_rate) if len(by_node) > 1 else {}
    return {
        **between,
        "alpha": ring_alpha,
        "beta": beta,
        "ping_pong_alpha": alpha,
        "gamma": 1 / add_rate,
        "exchange_GBps": (LARGE - SMALL) / max(large - small, 1e-12) / 1e9,
        "ring_GBps": 1 / beta / 1e9,
        "one_way_GBps": LARGE / one_way / 1e9,
        "reduce_GBps": add_rate / 1e9,
        "host": socket.gethostname(),
        "ranks": comm.size,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def _by_node(comm) -> list[list[int]]:
    """The group's ranks by node (runtime/nodes.py), nodes in order of their first rank."""
    owner = minipar.node_map(comm)
    return [[r for r in range(comm.size) if owner[r] == n] for n in dict.fromkeys(owner)]


def measure_between_nodes(comm, timer, gamma: float) -> dict:
    """The link between nodes: alpha and beta fitted (fit_ring) to the ring all-reduce of one
    rank a node (the first of each), every step of which crosses between nodes; the bare
    ping-pong between node 0 and node 1 beside it. {} when the nodes differ in size."""
    by_node = _by_node(comm)
    if len({len(m) for m in by_node}) != 1:
        return {}
    leaders = [m[0] for m in by_node]
    across = minipar.new_group(leaders)  # collective: every rank makes it
    pair = (leaders[0], leaders[1])
    alpha = _pair_times(comm, timer, 8, 200, exchange=False, pair=pair)
    one_way = _pair_times(comm, timer, LARGE, 3, exchange=False, pair=pair)
    n = len(leaders)
    inter_alpha, inter_beta = fit_ring(
        comm, timer, "ring@mpi", lambda b: cost.traffic("all_reduce", "ring", b, n), alpha,
        gamma, across, comm.rank in leaders,
    )  # fmt: skip
    return {
        "inter_alpha": inter_alpha,
        "inter_beta": inter_beta,
        "inter_ping_pong_alpha": alpha,
        "inter_one_way_GBps": LARGE / one_way / 1e9,
        "inter_ring_GBps": 1 / inter_beta / 1e9,
        "nodes": n,
        "per_node": len(by_node[0]),
    }


def as_inter_link(fit: dict):
    """The between-node link of a fit that spanned nodes (None when it did not)."""
    if "inter_alpha" not in fit:
        return None
    source = f"minipar bench --fit between {fit['nodes']} nodes of {fit['per_node']} ranks"
    return cost.Link("fitted-inter", fit["inter_alpha"], fit["inter_beta"], fit["gamma"], source)


def inter_path(path: str) -> str:
    """Where --fit stores the between-node link: beside the MPI link's file."""
    root, ext = os.path.splitext(path)
    return f"{root}-inter{ext or '.json'}"


def measure_shm(comm, timer, gamma: float | None = None) -> dict | None:
    """The shared windows' link (comm/transport/shm.py): alpha from `ring@shm` all-reduces of 8 B
    (its waits), beta fitted to its all-reduces of 1 to 64 MiB as for MPI (fit_ring, over the bytes
    the schedule copies), gamma `measure`'s (measured here if not given); None when this group
    cannot share memory."""
    # here, not at the top of the file: numpy loads only when used
    from minipar.comm.transport import shm

    if shm.node_of(comm, "bench --fit") is None:
        return None

    tiny = _all_reduce_time(timer, "ring@shm", 8, 200, typical=False)
    gamma = gamma or 1 / _reduce_rate(timer, LARGE)
    alpha = tiny / cost.shm_traffic("all_reduce", 8, comm.size).steps
    alpha, beta = fit_ring(
        comm, timer, "ring@shm", lambda n: cost.shm_traffic("all_reduce", n, comm.size), alpha,
        gamma,
    )  # fmt: skip
    return {"shm_alpha": alpha, "shm_beta": beta, "shm_gamma": gamma}


def as_shm_link(fit: dict):
    source = f"minipar bench --fit (shared windows), {fit['ranks']} ranks on {fit['host']}"
    name = f"fitted-shm:{fit['host']}"
    return cost.Link(name, fit["shm_alpha"], fit["shm_beta"], fit["shm_gamma"], source)


def shm_path(path: str) -> str:
    """Where --fit stores the windows' link: beside the MPI link's file."""
    root, ext = os.path.splitext(path)
    return f"{root}-shm{ext or '.json'}"


def as_link(fit: dict):
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
