"""Lesson 04: topology and bandwidth (text: lessons/04_topology_bandwidth.md).

    minipar lesson 04 -n 2                 # python -m minipar.course.lessons.l04_topology_bandwidth
    minipar lesson 04 --break no-wait      # a benchmark that forgets to wait, caught

A small all-reduce benchmark on this machine, the way nccl-tests reports it: time, algbw
(bytes / time) and busbw (algbw * 2(p-1)/p, comparable to a link's speed). First the cost model
predicts each time; then minipar's ring, minipar's `auto` and MPI's own MPI_Allreduce are timed,
against the roofline (the least time any all-reduce could take in this machine's memory). Then
alpha and beta are fitted to the measurements, and the model is scaled to an 8-GPU NVLink node
and to clusters of nodes joined by InfiniBand. `minipar bench` is the full version.
"""

from __future__ import annotations

import math
import time
from functools import partial

import numpy as np

import minipar
from minipar import cost, launcher
from minipar.bench import calibrate as measuring
from minipar.comm.transport import shm, shm_buffers
from minipar.cost import calibration, roofline
from minipar.course import claims as C
from minipar.course.lessons import planted
from minipar.course.lessons.l01_hierarchy import peers, ping_pong
from minipar.course.lessons.page import Page, fmt_bytes, fmt_rate, fmt_time
from minipar.course.machine import QUICK_SIZES, link_bits
from minipar.launcher.cluster import link as links

GRADIENTS_7B = 7e9 * 2  # a 7B-parameter model's bf16 gradients, bytes


def bus_factor(p: int) -> float:
    """All-reduce's busbw / algbw (nccl-tests): each rank's link carries 2(p-1)/p of the buffer
    in a bandwidth-optimal all-reduce, so busbw is what the link itself delivered."""
    return 2 * (p - 1) / p


def fit_alpha_beta(steps, nbytes, seconds) -> tuple[float, float]:
    """Least squares for seconds = steps * alpha + nbytes * beta, on relative error (each row
    divided by its time), so that 8 B and 16 MiB count alike although their times differ a
    thousandfold. Exercise ex04 asks for the plain fit, one step per message."""
    t = np.asarray(seconds, float)
    a = np.column_stack([np.asarray(steps, float), np.asarray(nbytes, float)]) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return float(alpha), float(beta)


def cluster_rows():
    """(GPUs, where, algorithm, predicted seconds) for all-reducing 7B bf16 gradients."""
    rows = []
    for nodes, algorithm in (
        (1, "ring"),
        (8, "ring"),
        (8, "hierarchical"),
        (64, "ring"),
        (64, "hierarchical"),
    ):
        where = "one node, NVLink 5" if nodes == 1 else f"{nodes} nodes, NVLink 5 + IB NDR"
        seconds = cost.all_reduce_on_cluster(GRADIENTS_7B, nodes, algorithm, cost.DGX_B200)
        rows.append((nodes * cost.DGX_B200.per_node, where, algorithm, seconds))
    return rows


def claims() -> list[str]:
    """Numbers lessons/04_topology_bandwidth.md states; tests/test_lessons.py checks the text."""
    return [
        f"{bus_factor(4):g}",
        f"{bus_factor(8):g}",
        *(fmt_time(seconds) for *_, seconds in cluster_rows()),
        f"({GRADIENTS_7B / 1e9:.0f} GB)",
        fmt_rate(1 / cost.NVLINK5.beta),
        f"{cost.DGX_B200.per_node} times fewer bytes",
    ]


# -- measuring -------------------------------------------------------------------------------------


def timed(page: Page, op, reps: int, warm: bool = True) -> float:
    """Median over reps of (barrier; op()), each iteration's time the slowest rank's."""
    return spread(page, op, reps, warm)[1]


def fastest(page: Page, op, reps: int, prepare=None) -> float:
    """The fastest of reps (barrier; op()), each the slowest rank's time, op warmed up by the
    caller: one side of an alternated pair. A run that other processes interrupted is slower,
    never faster, so the fastest is the least disturbed on a shared machine."""
    return spread(page, op, reps, warm=False, prepare=prepare)[0]


def spread(
    page: Page, op, reps: int, warm: bool = True, prepare=None
) -> tuple[float, float, float]:
    """(min, median, max) over reps of (barrier; op()), each the slowest rank's time, after one
    untimed warm-up call (unless warm is False: the caller warmed it up); `prepare()`, when
    given, runs after each barrier, untimed, right before op (it puts the buffers in the state
    op meets, and no wait comes between them)."""
    if warm:
        op()
    mine = []
    for _ in range(reps):
        page.comm.barrier()
        if prepare is not None:
            prepare()
        t0 = time.perf_counter()
        op()
        mine.append(time.perf_counter() - t0)
    slowest = np.max(np.array(page.gather(mine)), axis=0)
    return float(slowest.min()), float(np.median(slowest)), float(slowest.max())


def implementations(page: Page, x: np.ndarray) -> dict:
    """name -> a no-argument function that all-reduces x in place."""
    ops = {
        "minipar ring": lambda: minipar.all_reduce(x, algorithm="ring@mpi"),  # as the model
        "minipar auto": lambda: minipar.all_reduce(x),
    }
    mpi = getattr(page.comm, "mpi", None)  # the MPI transport's own communicator
    if mpi is not None:
        from mpi4py import MPI

        ops["MPI_Allreduce"] = lambda: mpi.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    return ops


def kernel_rates(page: Page, nbytes: int) -> tuple[float, float]:
    """This machine's copy and add bandwidth (bytes/s), every rank at once: the one way every
    lesson measures them (bench.calibrate.copy_rates)."""
    return measuring.copy_rates(page.comm, nbytes)


def sizes(quick: bool) -> list[int]:
    return [8, 256 << 10, 8 << 20] if quick else [8 << k for k in range(0, 24, 3)]


# -- sections --------------------------------------------------------------------------------------


def predict_section(page: Page, machine) -> None:
    p, link = page.size, machine.collective
    page.prediction(f"ring all-reduce on {p} ranks, {link.name}")
    page.say(
        f"algbw = bytes / time; busbw = algbw x 2(p-1)/p = algbw x {bus_factor(p):g}. The model: "
        f"2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma, with alpha a collective step's cost "
        f"{fmt_time(link.alpha)} (message latency {fmt_time(machine.message.alpha)} + "
        f"minipar's Python per step {fmt_time(machine.step_s)}) and 1/beta "
        f"{fmt_rate(1 / link.beta)}: {machine.basis}; 1/gamma {fmt_rate(1 / link.gamma)}: the add "
        "rate measured at the start of this lesson."
    )
    rows = []
    for n in sizes(page.quick):
        t = cost.predict("all_reduce", "ring", n, p, link)
        rows.append((fmt_bytes(n), fmt_time(t), fmt_rate(n / t), fmt_rate(n / t * bus_factor(p))))
    page.table(None, ["size>", "time>", "algbw>", "busbw>"], rows)
    knee = link.alpha / link.beta * p  # where the ring's latency and bandwidth terms are equal
    page.say(
        f"The knee (latency = bandwidth term) is near {fmt_bytes(knee)}: below it time is "
        "flat (latency-bound), above it grows with n (bandwidth-bound)."
    )


def shape(page: Page) -> tuple[int, int] | None:
    """(nodes, ranks a node) when the ranks span nodes of equal size, else None."""
    node_of = minipar.node_map()
    n_nodes, k = len(set(node_of)), node_of.count(node_of[0])
    return (n_nodes, k) if n_nodes > 1 and n_nodes * k == page.size else None


def between_nodes(page: Page, machine) -> cost.Link | None:
    """The link between nodes as a collective's step pays it: measured by ping-pong (rank 0 to
    the first rank of another node), plus minipar's Python per step. None on one node."""
    if shape(page) is None:
        return None
    wire = link_between_nodes(page, minipar.node_map())
    return cost.Link(wire.name, wire.alpha + machine.step_s, wire.beta, machine.collective.gamma)


def ring_model(page: Page, machine, nbytes: int, inter, algorithm: str = "ring") -> float:
    """The model's time of one all-reduce here: on this machine's link, or on both links when
    the ranks span nodes (every ring step then waits for the link between them)."""
    if inter is None:
        return cost.predict("all_reduce", algorithm, nbytes, page.size, machine.collective)
    return cost.predict_on_nodes("all_reduce", algorithm, nbytes, *shape(page),
                                 machine.collective, inter)  # fmt: skip


def bench_section(page: Page, machine, inter=None) -> list[tuple]:
    p = page.size
    copy_rate, add_rate = machine.copy_Bps, machine.add_Bps
    page.measurement("this machine's memory (the roofline's two kernels, all ranks at once)")
    page.table(
        None, ["kernel", "bandwidth>"], [("copy", fmt_rate(copy_rate)), ("add", fmt_rate(add_rate))]
    )
    if p > launcher.cores():
        page.say(
            f"[yellow]{p} ranks on {launcher.cores()} cores: oversubscribed, so these times "
            "measure the scheduler as much as the algorithms (the verdicts say so).[/]"
        )
    link = inter or machine.collective  # across nodes, the slow link sets the knee
    knee = link.alpha / link.beta * p
    call_s = mpi_call_cost(page) if getattr(page.comm, "mpi", None) is not None else 0.0
    rows, fits, judged = [], [], []
    for n in sizes(page.quick):
        x = np.ones(max(n // 4, 1), np.float32)
        floor = roofline.lower_bound("all_reduce", x.nbytes, p, copy_rate, add_rate)
        model = ring_model(page, machine, x.nbytes, inter)
        reps = 5 if page.quick else (20 if n < 1 << 20 else 5)
        ops = implementations(page, x)
        paired = None
        if "MPI_Allreduce" in ops:  # the ring and MPI's own, alternated: their ratio is judged
            ring, mpi = ops.pop("minipar ring"), ops.pop("MPI_Allreduce")
            ring(), mpi()  # warm up
            paired = page.alternate(partial(fastest, page, ring, reps),
                                    partial(fastest, page, mpi, reps),
                                    PAIRS if page.quick else 2 * PAIRS)  # fmt: skip
            measured = {"minipar ring": paired.seconds[0], "MPI_Allreduce": paired.seconds[1]}
        else:
            measured = {"minipar ring": timed(page, ops.pop("minipar ring"), reps)}
        measured |= {name: timed(page, op, reps) for name, op in ops.items()}
        for name, t in measured.items():
            algbw = x.nbytes / t
            rows.append((fmt_bytes(x.nbytes), name, fmt_time(t), fmt_rate(algbw),
                         fmt_rate(algbw * bus_factor(p)),
                         fmt_time(model) if name == "minipar ring" else "",
                         f"{floor / t:.0%}"))  # fmt: skip
        t = measured["minipar ring"]
        fits.append((2 * (p - 1), 2 * (p - 1) / p * x.nbytes, t))
        judged.append((x.nbytes, model, t, floor, paired))
    page.measurement(
        f"all-reduce, float32, {p} ranks (the slowest rank's; the ring and "
        "MPI_Allreduce the median of their pairs' fastest)"
    )
    page.table(
        None,
        ["size>", "implementation", "time>", "algbw>", "busbw>", "model>", "roofline>"],
        rows,
        caption="roofline: the floor's time / the measured time; the ring and MPI_Allreduce "
        "alternated, pair by pair",
    )
    say_coherence(page, [n for n, *_, paired in judged if paired is not None])
    for n, model, t, floor, paired in judged:
        bound = "latency" if n < knee else "bandwidth"
        tolerance = C.LATENCY_BOUND if n < knee else C.BANDWIDTH_BOUND
        page.check(t >= floor, f"the ring's {fmt_bytes(n)} respects the roofline")
        if paired is None:  # no MPI_Allreduce to pair with: the absolute time
            page.claim(f"ring all-reduce of {fmt_bytes(n)} ({bound}-bound)", model, t, "s",
                       tolerance, bound=(floor, float("inf")), basis=machine.basis,
                       causes=[beyond_the_sweep(n / p, model, t, machine)])  # fmt: skip
            continue
        ring = model if inter is not None else mpi_ring_model(page, machine, n)  # one node:
        predicted = ring / mpi_model(page, machine, n, inter, call_s)  # exchanges timed now
        page.ratio_claim(
            f"minipar's ring / MPI_Allreduce at {fmt_bytes(n)} ({bound}-bound)",
            predicted,
            paired,
            f"MPI_Allreduce of the same {fmt_bytes(n)}",
            tolerance,
            basis=f"{machine.basis}; MPI exchanges timed now; MPICH's {mpich_algorithm(n, p)}; "
            f"sums timed now: numpy's {fmt_rate(1 / reduce_gamma(page, n / p))}, MPICH's "
            f"{fmt_rate(1 / reduce_gamma(page, mpi_sum_chunk(n, p), 'mpi'))}",
        )
    return fits


def say_coherence(page: Page, sizes: list[int]) -> None:
    """What the ring's sums cost where its chunks stay in cache: a sum into lines the neighbour
    has just read against the same sum on private lines, both timed now (collective)."""
    fits = [n for n in sizes if 1 << 10 <= n // page.size <= 1 << 20]  # in a core's cache
    if not fits or getattr(page.comm, "mpi", None) is None:
        return
    n = max(fits) // page.size
    shared, private = (reduce_gamma(page, n, private=flag) * n for flag in (False, True))
    why = ("each line is first taken back from the other core's cache" if shared > 1.5 * private
           else "on this machine such a line costs about what a private one does")  # fmt: skip
    page.say(
        f"A ring step adds the chunk it received into one its neighbour has just read (the "
        f"all-gather sent it). A sum of {fmt_bytes(n)} took {fmt_time(shared)} so, "
        f"{fmt_time(private)} on lines no other core had read: {why}. Both are timed now, "
        "and the models below price the ring's and MPICH's sums the first way."
    )


SUM_MIN_BYTES = 64 << 10  # a sum's rate is timed on this many bytes at least (reduce_gamma)
PAIRS = 5  # alternated pairs a ratio is judged on (--quick; twice as many in the full lesson)
MPICH_SHORT = 2048  # MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE: MPICH's all-reduce switches above it


def mpich_algorithm(nbytes: int, p: int) -> str:
    """The all-reduce MPICH runs (its default selection, a commutative sum): recursive doubling
    for short messages, Rabenseifner's reduce-scatter + all-gather above."""
    return "recursive_doubling" if nbytes <= MPICH_SHORT else "rabenseifner"


def mpi_model(page: Page, machine, nbytes: int, inter, call_s: float = 0.0) -> float:
    """The model's time of one MPI_Allreduce: the call's own cost (`call_s`: mpi_call_cost),
    then MPICH's algorithm: on one node each of its steps one MPI exchange of that step's
    message, timed now (mpi_exchange: whatever protocol MPI picks at that size), and its
    reductions at the measured gamma; on both links when the ranks span nodes, a bare MPI
    message's latency per step (C, no minipar Python). MPICH reduces with its own loop, not
    numpy's: its reductions at its own rate, timed now (reduce_gamma)."""
    algorithm = mpich_algorithm(nbytes, page.size)
    m = machine.message
    moved = cost.traffic("all_reduce", algorithm, nbytes, page.size)
    gamma = reduce_gamma(page, mpi_sum_chunk(nbytes, page.size), "mpi")
    if inter is None:
        step = mpi_exchange(page, moved.bytes_sent / max(moved.steps, 1))
        return call_s + moved.steps * step + moved.bytes_reduced * gamma
    inside = cost.Link("a bare MPI message", machine.bare_s, m.beta, gamma, machine.basis)
    wire = cost.Link(inter.name, inter.alpha - machine.step_s, inter.beta, inter.gamma)
    return call_s + cost.predict_on_nodes("all_reduce", algorithm, nbytes, *shape(page), inside,
                                          wire)  # fmt: skip


def mpi_exchange(page: Page, nbytes: float, reps: int = 20) -> float:
    """Seconds of one MPI Sendrecv of nbytes with the ring's neighbours (each rank sends to the
    next and receives from the previous, as one step of a collective does), the fastest of
    reps, the slowest rank's (collective; timed once a size in a lesson's run, every rank
    asking in the same order, so the ring's and MPI's steps of one size are priced alike)."""

    def make():
        a = np.ones(max(int(nbytes) // 4, 1), np.float32)
        b = np.empty_like(a)
        right, left = (page.rank + 1) % page.size, (page.rank - 1) % page.size
        return lambda: page.comm.mpi.Sendrecv(a, right, 7, b, left, 7)

    return timed_once(page, ("exchange", nbytes), make, reps)


def mpi_sum_chunk(nbytes: int, p: int) -> float:
    """The bytes one of MPICH's reduction steps sums, on average: what it reduces over its
    log2(p) reducing steps (all of n in each for recursive doubling; n/2, n/4, ... for
    Rabenseifner's reduce-scatter)."""
    moved = cost.traffic("all_reduce", mpich_algorithm(nbytes, p), nbytes, p)
    return moved.bytes_reduced / max(round(math.log2(p)), 1)


def reduce_gamma(
    page: Page, nbytes: float, by: str = "numpy", reps: int = 20, private: bool = False
) -> float:
    """Seconds per byte of a float32 sum of nbytes into a buffer, as a reduce-scatter step
    reduces its chunk, timed now: `by` "numpy" (np.add, minipar's reduction) or "mpi"
    (MPI.SUM.Reduce_local, the loop MPICH runs inside MPI_Allreduce: the wheel's sums 2-5x
    slower than numpy's on private memory here). The fastest of reps, the slowest rank's
    (collective; timed once a size).

    Each repetition first puts the buffers where a step finds them (over MPI): the chunk it
    adds into was read by the right neighbour a moment ago (the previous call's all-gather sent
    it, straight out of this buffer: one copy by the kernel, on the neighbour's core), and what
    it adds was just received. Writing a line that sits in another core's cache first takes
    it back from there: at sizes that stay in cache that, not the add, is the step's time
    (measured here: 128 KiB in 3 us with the lines private, 32-33 us after the neighbour read
    them, while MPICH's slower scalar loop went from 10 to 14 us: docs/records/
    2026-12-08-coherence.txt). With `private`, the same sum on lines no other core has seen.
    A rate per byte: below SUM_MIN_BYTES the sum is timed at that size, as the roofline's
    kernels are (a call on a few bytes is its Python, which a collective step's cost prices)."""
    count = max(int(nbytes), SUM_MIN_BYTES) // 4
    mpi = getattr(page.comm, "mpi", None)

    def make():
        received, mine = np.ones(count, np.float32), np.ones(count, np.float32)
        right, left = (page.rank + 1) % page.size, (page.rank - 1) % page.size
        if by == "mpi":
            from mpi4py import MPI  # only on the MPI transport, which has page.comm.mpi

            op = lambda: MPI.SUM.Reduce_local(received, mine)  # noqa: E731
        else:
            op = lambda: np.add(mine, received, out=mine)  # noqa: E731
        if mpi is None or page.size < 2 or private:
            return op
        return op, lambda: mpi.Sendrecv(mine, right, 8, received, left, 8)  # as a ring step

    return timed_once(page, ("sum", by, 4 * count, private), make, reps) / (4 * count)


def timed_once(page: Page, key, make, reps: int) -> float:
    """fastest() of the op that make() builds (or of (op, prepare): prepare() runs before each
    repetition, untimed), after a warm-up call: timed once per key in a lesson's run and kept
    on the page (collective: every rank asks for the same keys in the same order)."""
    timed_now = vars(page).setdefault("timed_now", {})
    if key not in timed_now:
        built = make()
        op, prepare = built if isinstance(built, tuple) else (built, None)
        op()  # warm up
        timed_now[key] = fastest(page, op, reps, prepare)
    return timed_now[key]


def exchange_bandwidth(page: Page, chunks: list[float]) -> float | None:
    """Bytes/s of a ring step's exchange, from MPI exchanges of the smallest and largest chunk
    timed now (mpi_exchange: each rank sends to the next and receives from the previous at
    once, as the ring does, where a ping-pong sends one way at a time); None without MPI or
    with no slope (collective)."""
    if getattr(page.comm, "mpi", None) is None or len(chunks) < 2:
        return None
    small, large = min(chunks), max(chunks)
    slope = (mpi_exchange(page, large) - mpi_exchange(page, small)) / (large - small)
    return 1 / slope if slope > 0 else None


def mpi_ring_model(page: Page, machine, n: int) -> float:
    """Seconds of minipar's ring over MPI (ring@mpi) of n bytes: 2(p-1) steps, each one MPI
    exchange of its n/p-byte chunk timed now (mpi_exchange) plus minipar's Python per step,
    and (p-1)/p n bytes reduced at numpy's rate on an n/p chunk, timed now (reduce_gamma)."""
    p = page.size
    step = mpi_exchange(page, n / p) + machine.step_s
    return 2 * (p - 1) * step + (p - 1) / p * n * reduce_gamma(page, n / p)


def mpi_call_cost(page: Page, reps: int = 200) -> float:
    """Seconds one MPI_Allreduce call costs before any message: mpi4py's and MPICH's own work
    (argument checks, the algorithm's choice, the local reduction), timed on MPI_COMM_SELF,
    where nothing moves; the slowest rank's fastest call (collective)."""
    from mpi4py import MPI  # here: mpi4py only on the MPI transport, which has page.comm.mpi

    buf = np.zeros(2, np.float32)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        MPI.COMM_SELF.Allreduce(MPI.IN_PLACE, buf)
        best = min(best, time.perf_counter() - t0)
    return max(page.gather(best))


def beyond_the_sweep(message: float, model: float, t: float, machine) -> str:
    """A measured cause when the ring ran faster than its model with messages larger than any
    the link was measured with: MPICH moves large messages by another protocol (rendezvous, one
    copy between processes) than the eager sizes the link's beta came from."""
    calibrated = machine.basis.startswith("calibrated")  # its sweep, else the lesson's own
    largest = max(measuring.LINK_SIZES if calibrated else QUICK_SIZES)
    if t >= model or message <= largest:
        return ""
    return (f"its messages ({fmt_bytes(message)}) are larger than any the link was measured "
            f"with ({fmt_bytes(largest)}): MPI's large-message protocol ran "
            f"{model / t:.1f}x faster than the link's beta says")  # fmt: skip


def source(machine) -> str:
    """Where this machine's link numbers come from, in two words."""
    return "calibrated" if machine.basis.startswith("calibrated") else "measured at the start"


def fit_section(page: Page, fits, machine, inter=None) -> None:
    p = page.size
    # the reduction's share priced apart, (p-1)/p n bytes at numpy's rate on the ring's chunk,
    # on private lines: what taking back lines a neighbour read costs the sum varies from run to
    # run on this host, and subtracted whole it left some runs' fits no bytes to fit
    sizes = [s * p / (2 * (p - 1)) for _, s, _ in fits]  # n, from the bytes each rank sent
    rest = [
        t - (p - 1) / p * n * reduce_gamma(page, n / p, private=True)
        for n, (_, _, t) in zip(sizes, fits)
    ]
    steps, sent, seconds = zip(*fits)
    fit = calibration.fit_link(steps, sent, [max(r, 1e-9) for r in rest])
    page.measurement(
        "alpha and beta fitted to the ring's times (least squares; alpha, the fit's "
        "intercept, >= 0)"
    )
    model = machine.collective
    fitted = (
        ("fitted here", fmt_time(fit.alpha), fmt_rate(fit.bandwidth))
        if fit.physical
        else ("fitted here", "unphysical", f"[red]{fit.why}[/]")
    )
    rows = [
        fitted,
        (f"this machine ({source(machine)})", fmt_time(model.alpha), fmt_rate(1 / model.beta)),
    ]
    both_ways = exchange_bandwidth(page, [n / p for n in sizes]) if inter is None else None
    if both_ways is not None:
        rows.append(("an MPI exchange of the ring's chunks, timed now", "", fmt_rate(both_ways)))
    page.table(None, ["", "alpha>", "bandwidth 1/beta>"], rows)
    if inter is not None:
        page.say("[dim]The ring crosses both links here: its fit mixes them, so it is shown, "
                 "not judged against this machine's in-node link.[/]")  # fmt: skip
    elif fit.physical:
        page.claim("the fit's intercept (a collective step's cost)", model.alpha, fit.alpha, "s",
                   C.LATENCY_BOUND,
                   basis=machine.basis)  # fmt: skip
        if both_ways is not None:  # a ring step sends and receives at once: priced so
            page.claim("fitted bandwidth 1/beta", both_ways, fit.bandwidth, "B/s",
                       C.BANDWIDTH_BOUND, basis="MPI exchanges of the ring's smallest and "
                       "largest chunks (each rank sending and receiving), timed now")  # fmt: skip
        else:
            largest = max(sizes) / p  # the ring's largest message
            faster = beyond_the_sweep(largest, model.beta, 1 / fit.bandwidth, machine)
            page.claim("fitted bandwidth 1/beta", 1 / model.beta, fit.bandwidth, "B/s",
                       C.BANDWIDTH_BOUND, basis=machine.basis, causes=[faster])  # fmt: skip
    else:
        page.claim("the fit is physical (alpha >= 0, beta > 0)", True, False, "",
                   C.EXACT, causes=[fit.why])  # fmt: skip


def cluster_section(page: Page) -> None:
    page.prediction("the same model on real GPUs: 7B bf16 gradients (14 GB), B200 nodes")
    page.table(
        None,
        ["GPUs>", "where", "algorithm", "predicted>"],
        [(g, w, a, fmt_time(s)) for g, w, a, s in cluster_rows()],
        caption="cost.all_reduce_on_cluster; hierarchical = reduce-scatter in the node, "
        "all-reduce across nodes, all-gather in the node",
    )
    rows = cluster_rows()
    page.check(rows[2][3] < rows[1][3], "hierarchical beats a flat ring across 8 nodes")


def measured_link(page: Page, peer: int, nbytes: int = 8 << 20, name: str = "") -> cost.Link:
    """A link measured between rank 0 and `peer`: lesson 01's ping-pong of 8 B (alpha) and of
    nbytes (beta), the best of a few each."""
    alpha = ping_pong(page.comm, 8, 20, peer)
    big = ping_pong(page.comm, nbytes, 5, peer)
    alpha, big = page.gather((alpha, big))[0]  # rank 0 timed them
    beta = max(big - alpha, 1e-12) / nbytes
    return cost.Link(name or f"measured, rank 0 - {peer}", alpha, beta, cost.default_link().gamma)


def link_between_nodes(page: Page, node_of) -> cost.Link:
    """The link between nodes, measured from rank 0 to the first rank of another node."""
    return measured_link(page, peers(node_of)[1], name="measured between nodes")


def nodes_section(page: Page, machine, inter) -> None:
    """On emulated (or real) nodes: the flat ring against the two-level all-reduce across them,
    predicted from the two measured links, then measured."""
    node_of = minipar.node_map()
    n_nodes, k = len(set(node_of)), node_of.count(node_of[0])
    if n_nodes < 2 or n_nodes * k != page.size:
        page.say("(`minipar lesson 04 --nodes 2` as root measures the two-level all-reduce.)")
        return
    wire = cost.Link(inter.name, inter.alpha - machine.step_s, inter.beta, inter.gamma)
    intra = machine.collective
    n = (16 if page.quick else 64) << 20
    page.prediction(f"all-reduce of {fmt_bytes(n)} on {n_nodes} nodes x {k} ranks, two links")
    page.say(
        f"between nodes (measured here, on an emulated link of {links.describe(link_bits())}): "
        f"alpha {fmt_time(wire.alpha)}, 1/beta {fmt_rate(1 / wire.beta)}; inside: this "
        f"machine's ({fmt_rate(1 / intra.beta)}). The ring crosses "
        "every node's cable with 2(p-1)/p of the buffer; the two-level scheme sends only "
        "2(S/k)(N-1)/N from each rank across, all k ranks of a node at once."
    )
    predicted = {a: cost.predict_on_nodes("all_reduce", a, n, n_nodes, k, intra, inter)
                 for a in ("ring", "hierarchical")}  # fmt: skip
    x = np.ones(n // 4, dtype=np.float32)
    pairs = 3 if page.quick else 5
    ops = {a: partial(minipar.all_reduce, x, algorithm=a) for a in predicted}
    for op in ops.values():
        op()  # warm up
    paired = page.alternate(*(partial(fastest, page, ops[a], 2) for a in ops), pairs)
    measured = {"ring": (min(paired.a), paired.seconds[0], max(paired.a)),
                "hierarchical": (min(paired.b), paired.seconds[1], max(paired.b))}  # fmt: skip
    page.measurement(f"the same, alternated, median of {pairs} pairs (slowest rank)")
    rows = [(a, fmt_time(predicted[a]), fmt_time(measured[a][1])) for a in predicted]
    ratio = predicted["ring"] / predicted["hierarchical"]
    seen = paired.ratio
    rows.append(("ring / hierarchical", f"{ratio:.2f}x", f"{seen:.2f}x"))
    page.table(None, ["algorithm", "predicted>", "measured>"], rows)
    tcp = "TCP's window and headers on the emulated link"
    for a in predicted:
        page.claim(f"{a} all-reduce of {fmt_bytes(n)} across {n_nodes} nodes", predicted[a],
                   measured[a][1], "s", C.BANDWIDTH_BOUND, spread=measured[a],
                   basis=machine.basis, causes=[tcp])  # fmt: skip
    page.ratio_claim(f"ring / hierarchical at {fmt_bytes(n)} on {n_nodes} x {k}", ratio, paired,
                     "the two-level all-reduce of the same bytes", C.BANDWIDTH_BOUND,
                     basis=machine.basis)  # fmt: skip
    page.ratio_claim("the two-level all-reduce beats the flat ring across nodes", 1.0, paired,
                     "the two-level all-reduce of the same bytes", C.at_least())  # fmt: skip


def one_copy_section(page: Page, machine) -> None:
    """MPI's bounce buffer against a shared window, side by side, on the ranks of this node."""
    page.section("One copy or two")
    mpi = getattr(page.comm, "mpi", None)
    if mpi is None or shm.node_of(page.comm, "lesson 04") is None:
        page.say("This group cannot share memory (not MPI, or it spans nodes): nothing to compare.")
        return
    n = (4 << 20) if page.quick else (32 << 20)
    half = n // 2
    a, b = np.ones(half // 4, np.float32), np.empty(half // 4, np.float32)
    right, left = (page.rank + 1) % page.size, (page.rank - 1) % page.size
    x = np.ones(n // 4, np.float32)
    owned = minipar.empty(n // 4, np.float32)  # this rank's segment of a shared window
    owned[:] = 1
    rows = [
        (
            "MPI Sendrecv of n/2 (in and out of a bounce buffer)",
            lambda: mpi.Sendrecv(a, right, 5, b, left, 5),
        ),  # fmt: skip
        ("one numpy copy of n/2 (what a window read costs)", lambda: np.copyto(b, a)),
        (
            "ring all-reduce over MPI (ring@mpi)",
            lambda: minipar.all_reduce(x, algorithm="ring@mpi"),
        ),
        (
            "all-reduce over shared windows (ring@shm)",
            lambda: minipar.all_reduce(x, algorithm="ring@shm"),
        ),  # fmt: skip
        (
            "all-reduce of a buffer in the window (minipar.empty)",
            lambda: minipar.all_reduce(owned, algorithm="ring"),
        ),  # fmt: skip
    ]
    times = [timed(page, op, 3) for _, op in rows]
    page.table(
        f"n = {fmt_bytes(n)} on {page.size} ranks of one node",
        ["what", "time>"],
        [(name, fmt_time(t)) for (name, _), t in zip(rows, times)],
    )
    x[:] = 1
    minipar.all_reduce(x, algorithm="ring@shm")
    page.check(bool((x == page.size).all()), "the windows' all-reduce is right")
    windows_against_mpi(page, machine, x)
    page.say(
        "Inside a node MPI moves a message twice: the sender copies it into a shared bounce "
        "buffer, the receiver copies it out. With a shared window (MPI.Win.Allocate_shared) each "
        "rank writes its data once into its own segment and the peers reduce or copy straight "
        "out of it. Whether that wins depends on the machine: MPICH's bounce cells are small "
        "and stay in cache, so its second copy is cheap; a window read of data the peer wrote a "
        "moment ago crosses cores. Measure, then let the cost model price each transport. A "
        "buffer that lives in the window from the start (minipar.empty; DDP's buckets, FSDP's "
        "flat vectors) skips even the one copy in: the peers reduce it where it lies, which is "
        "the roofline's work and nothing more."
    )
    page.say(
        "GPUs have the same choice. Staging through the host copies device to host, host to "
        "host, host to device; CUDA IPC (cudaIpcGetMemHandle) maps a peer GPU's buffer, and "
        "over NVLink peer-to-peer a kernel reads or reduces straight out of it: one copy per "
        "hop, which is how NCCL moves data inside an NVLink domain."
    )


def window_model(page: Page, machine, n: int) -> float:
    """Seconds of the all-reduce over shared windows of a private buffer of n bytes, priced at
    rates measured now (collective): my (p-1) chunks copied into my segment and my result put
    there at the private copy rate; my chunk reduced from the peers' segments into my segment
    as the schedule does it (schedule_add_rate); the p-1 results copied out at the rate of
    reading what another core has just written (cost.roofline.peer_rates); three steps, each a
    collective step's cost (windows.py's schedule, cost.shm_traffic's bytes)."""
    p = page.size
    count = max(roofline.MIN_BYTES, n // p) // 4
    mine = minipar.empty(count, np.float32)
    theirs = shm_buffers.twins(shm.node_of(page.comm), mine)[(page.rank + 1) % p].view(np.float32)
    slowest = lambda t: max(page.gather(t))  # noqa: E731 - the rates are the slowest rank's
    peer_copy, _ = roofline.peer_rates(
        mine, theirs, np.zeros(count, np.float32), page.comm.barrier, slowest
    )
    c = (p - 1) / p * n
    return (3 * machine.collective.alpha + (c + n / p) / machine.copy_Bps
            + c / schedule_add_rate(page, mine, theirs) + c / peer_copy)  # fmt: skip


def schedule_add_rate(page: Page, mine, theirs, reps: int = 10) -> float:
    """Bytes/s of the windows' reduction as their schedule runs it (collective): my private
    chunk plus the right neighbour's published one (`theirs`, just written there) into a
    second buffer of my segment, which the neighbours read out after each round (their gather,
    untimed): three arrays, and lines another core read a moment ago to write. cost.roofline.
    peer_rates' add, into its private input, has two: at 4 MiB on 2 ranks it priced the
    schedule's sum of 2 MiB at 141-148 us, which took 284-314 us inside the schedule
    (docs/records/2026-12-08-coherence.txt)."""
    p = page.size
    out = minipar.empty(len(mine), np.float32)  # my result's place; the peers read it
    their_out = shm_buffers.twins(shm.node_of(page.comm), out)[(page.rank + 1) % p]
    private, scratch = np.ones(len(mine), np.float32), np.zeros(len(mine), np.float32)
    best = float("inf")
    for turn in range(reps + 1):
        mine.fill(turn % 7)  # published: the neighbour adds it next
        page.comm.barrier()
        t0 = time.perf_counter()
        np.add(private, theirs, out=out)
        took = time.perf_counter() - t0
        page.comm.barrier()
        np.copyto(scratch, their_out.view(np.float32))  # the gather: my line read by a peer
        best = min(best, took) if turn else best  # the first round warms up
    return mine.nbytes / max(max(page.gather(best)), 1e-9)


def windows_against_mpi(page: Page, machine, x) -> None:
    """The all-reduce over shared windows against the one over MPI, alternated: their ratio
    against the model's price of each (window_model, at window reads measured now;
    mpi_ring_model, at MPI exchanges of the ring's chunk measured now)."""
    n = x.nbytes
    ops = [partial(minipar.all_reduce, x, algorithm=a) for a in ("ring@shm", "ring@mpi")]
    for op in ops:
        op()  # warm up
    paired = page.alternate(*(partial(fastest, page, op, 3) for op in ops), 3)
    start = page.snapshot()
    want = window_model(page, machine, n) / mpi_ring_model(page, machine, n)
    share = page.cpu_since(start)  # the rates the model was priced at: did the run have its cores?
    why = (f"the window model's rates were measured while the run did not get its cores: "
           f"{share.describe()}") if share.busy else ""  # fmt: skip
    won = "won" if paired.ratio < 1 else "lost"
    page.say(f"Here the windows {won}: {paired.ratio:.2f}x MPI's time, pair by pair.")
    page.ratio_claim(f"all-reduce over windows / over MPI at {fmt_bytes(n)}", want, paired,
                     f"ring@mpi of the same {fmt_bytes(n)}", C.BANDWIDTH_BOUND, causes=[why],
                     basis=f"window reads and MPI exchanges measured now; "
                           f"{machine.basis}")  # fmt: skip


def lab_no_wait(page: Page) -> None:
    p, n = page.size, 64 << 20  # large, so the floor (ms) dwarfs a loaded machine's hiccups
    page.section("Break-it lab: timing an async all-reduce without waiting for it")
    copy_rate, add_rate = kernel_rates(page, n)
    floor = roofline.lower_bound("all_reduce", n, p, copy_rate, add_rate)
    buffers = [np.ones(n // 4, np.float32) for _ in range(3)]
    pending = iter(buffers)
    minipar.all_reduce(buffers[0], algorithm="ring", async_op=True).wait()  # starts the thread
    page.comm.barrier()
    seconds, works = planted.time_async_without_wait(
        lambda: minipar.all_reduce(next(pending), algorithm="ring", async_op=True), len(buffers)
    )
    for work in works:
        work.wait()  # the bug skipped this inside the timing; the lab must still do it
    x = buffers[0]
    honest = timed(page, lambda: minipar.all_reduce(x, algorithm="ring"), 3)
    seconds = max(page.gather(seconds))
    page.table(
        f"all-reduce of {fmt_bytes(n)} on {p} ranks",
        ["timing", "time>", "busbw>"],
        [
            ("planted (no wait)", fmt_time(seconds), fmt_rate(n / seconds * bus_factor(p))),
            ("honest (blocking)", fmt_time(honest), fmt_rate(n / honest * bus_factor(p))),
            ("roofline floor", fmt_time(floor), fmt_rate(n / floor * bus_factor(p))),
        ],
    )
    page.check(
        seconds < floor,
        "the roofline check catches it: the planted time is below the "
        "least time memory allows, which no real all-reduce can be",
    )
    page.check(honest >= floor, "the honest time respects the roofline")


def main(argv=None) -> int:
    page = Page("04", "Topology and bandwidth", ("no-wait",), argv=argv, min_ranks=2)
    if page.enough and page.lab:
        lab_no_wait(page)
    elif page.enough:
        machine = page.machine()  # the one memory copy: 32 MiB, every rank
        inter = between_nodes(page, machine)
        predict_section(page, machine)
        fits = bench_section(page, machine, inter)
        fit_section(page, fits, machine, inter)
        one_copy_section(page, machine)
        cluster_section(page)
        nodes_section(page, machine, inter)
        page.try_this(
            [
                "minipar bench all_reduce -n 2 --against mpi,torch: the full sweep, with gloo.",
                "Fit alpha and beta yourself: exercises/ex04_alpha_beta_fit.py, then "
                "`minipar grade 04`.",
                "Write the two-level all-reduce from the ring pieces: "
                "exercises/ex04_hierarchical_allreduce.py (`minipar grade 04`).",
                "Run with -n 4 on a 2-core machine: what happens to alpha?",
                "Change cost.DGX_B200 to cost.DGX_H100 in cluster_rows(): how much does "
                "NVLink 4 cost?",
                "minipar lesson 04 --break no-wait: why is the planted busbw impossible?",
            ]
        )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
