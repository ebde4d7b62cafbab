"""Lesson 03: ring and tree algorithms (text: lessons/03_ring_and_tree.md).

    minipar lesson 03 -n 4                     # python -m minipar.course.lessons.l03_ring_and_tree
    minipar lesson 03 --break wrong-chunk      # a ring that sends the wrong chunk, caught
    minipar lesson 03 --break last-bit         # ranks that disagree in the last bit, caught

First the formulas (minipar.cost.traffic) predict the steps and bytes of each all-reduce. Then
minipar's own ring all-reduce runs step by step: rank r starts with 10^r in every chunk, so a
sum's digits say which ranks it contains (1011 = ranks 0, 1 and 3). Then the binomial tree and
recursive doubling, the ledger against the formulas, and the ring/latency crossover, predicted
and measured.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np

import minipar
from minipar import cost, launcher
from minipar.collectives import ring
from minipar.comm.transport.base import NonMember
from minipar.course import claims as C
from minipar.course.lessons import planted
from minipar.course.lessons.page import Page, fmt_bytes, fmt_rate, fmt_time

ALL_REDUCE = ["linear", "tree", "ring", "recursive_doubling", "rabenseifner", "double_tree"]
FORMULAS = {  # (steps, bytes sent by the busiest rank), n = buffer bytes, p a power of two
    "linear": ("2(p-1)", "(p-1) n"),
    "tree": ("2 log2 p", "n log2 p"),
    "ring": ("2(p-1)", "2(p-1)/p n"),
    "recursive_doubling": ("log2 p", "n log2 p"),
    "rabenseifner": ("2 log2 p", "2(p-1)/p n"),
    "double_tree": ("2 log2 p", "<= 2 n"),
}
# The link the text's numbers use: the cost model's default for shared memory, frozen here so
# the text does not change when someone fits their own machine.
TEXT_LINK = cost.Link("text", alpha=20e-6, beta=1 / 5e9, gamma=1 / 5e9)


class StepRecorder:
    """Wraps an algorithm's Call: after each step of the algorithm, keeps a copy of the buffer.
    Everything else (rank, size, sendrecv, ...) passes through to the real Call."""

    def __init__(self, call, x):
        self._call, self._x, self.snapshots = call, x, []

    def rounds(self, n: int):
        for i in self._call.rounds(n):
            yield i
            self.snapshots.append(self._x.copy())

    def __getattr__(self, name):
        return getattr(self._call, name)


def contributors(value: float) -> str:
    """1011.0 -> '0+1+3': the ranks whose 10^r is in the sum ('?' if a digit is not 0 or 1)."""
    digits = str(int(round(value)))[::-1]
    if set(digits) - {"0", "1"}:
        return f"?{int(round(value))}"
    return "+".join(str(r) for r, d in enumerate(digits) if d == "1")


def crossover(small: str, large: str, p: int, link) -> float:
    """The buffer size (bytes) above which all-reduce `large` beats `small` in the model."""
    n = cost.crossover("all_reduce", small, large, p, link)
    return float("nan") if n is None else n


def claims() -> list[str]:
    """Numbers lessons/03_ring_and_tree.md states; tests/test_lessons.py checks the text."""
    ring4 = cost.traffic("all_reduce", "ring", 1.0, 4)
    rd4 = cost.traffic("all_reduce", "recursive_doubling", 1.0, 4)
    ring8 = cost.traffic("all_reduce", "ring", 1.0, 8)
    return [
        f"{ring4.steps} steps",
        f"{ring4.bytes_sent:g} n",
        f"{ring8.bytes_sent:g} n",
        f"{rd4.bytes_sent:g} n",
        fmt_bytes(crossover("recursive_doubling", "ring", 4, TEXT_LINK)),
        fmt_bytes(crossover("recursive_doubling", "ring", 8, TEXT_LINK)),
        f"alpha {fmt_time(TEXT_LINK.alpha)}, {fmt_rate(1 / TEXT_LINK.beta)}",
    ]


# -- sections ----------------------------------------------------------------------------------


def formulas_section(page: Page, nbytes: int) -> None:
    p = page.size
    page.prediction(f"all-reduce of n = {fmt_bytes(nbytes)} on p = {p} ranks (minipar.cost)")
    rows = []
    for a in ALL_REDUCE:
        t = cost.traffic("all_reduce", a, nbytes, p)
        rows.append((a, *FORMULAS[a], t.steps, fmt_bytes(t.bytes_sent) + ("" if t.exact else "*")))
    page.table(
        None,
        ["algorithm", "steps", "bytes sent", "steps>", "bytes sent>"],
        rows,
        caption="* an upper bound",
    )


def ring_steps_section(page: Page) -> None:
    r, p = page.rank, page.size
    page.prediction("the ring all-reduce, one chunk per rank")
    page.say(
        f"Rank r starts with 10^r in each of its {p} chunks. Reduce-scatter: in step s rank r "
        "sends chunk r-s-1 to r+1 and adds what arrives from r-1 into chunk r-s-2; after "
        f"{p - 1} steps rank r owns the full sum of chunk r. All-gather: in step s it sends "
        f"chunk r-s, and after {p - 1} more steps everyone has every sum."
    )
    x = np.full(p, 10.0**r)
    recorder = []

    def ring_all_reduce_recorded(call, x, op):
        recorder.append(StepRecorder(call, x))
        ring.all_reduce_ring(recorder[0], x, op)  # minipar's own ring, unchanged

    start = x.copy()
    minipar.all_reduce(x, algorithm=ring_all_reduce_recorded)
    history = page.gather([start, *recorder[0].snapshots])  # history[q][s]: rank q after step s
    page.measurement("the buffers after each step (cell = ranks summed in that chunk)")
    for s in range(1, len(history[0])):
        phase = "reduce-scatter" if s <= p - 1 else "all-gather"
        rows = []
        for q in range(p):
            changed = np.flatnonzero(history[q][s] != history[q][s - 1])
            cells = [
                f"[bold]{contributors(v)}[/]" if c in changed else contributors(v)
                for c, v in enumerate(history[q][s])
            ]
            got = ",".join(str(c) for c in changed)
            rows.append((q, got, *cells))
        page.table(
            f"step {s - 1} ({phase})", ["rank>", "received chunk", *map(str, range(p))], rows
        )
    full = "+".join(str(q) for q in range(p))
    page.check(
        all(contributors(v) == full for q in range(p) for v in history[q][-1]),
        f"after {2 * (p - 1)} steps every chunk on every rank holds {full}",
    )


def _sends(page: Page, run) -> dict[int, list[str]]:
    """step -> ['src->dst', ...] for the messages of `run()`, gathered from every rank."""
    with minipar.trace() as t:
        run()
    mine = [(m.step, f"{page.rank}->{m.peer}") for m in t.messages if m.kind == "send"]
    steps: dict[int, list[str]] = {}
    for messages in page.gather(mine):
        for step, arrow in messages:
            steps.setdefault(step, []).append(arrow)
    return dict(sorted(steps.items()))


def trees_section(page: Page) -> None:
    p = page.size
    depth = (p - 1).bit_length()
    page.prediction(f"binomial broadcast in ceil(log2 {p}) = {depth} steps")
    steps = _sends(page, lambda: minipar.broadcast(np.zeros(8), src=0, algorithm="tree"))
    page.measurement("who sends to whom (the trace ledger)")
    page.table(None, ["step>", "messages"], [(s, "  ".join(m)) for s, m in steps.items()])
    page.check(len(steps) == depth, f"binomial broadcast took {depth} steps")
    p2 = 1 << (p.bit_length() - 1)
    extra = 0 if p2 == p else 2
    page.prediction(
        f"recursive doubling all-reduce: partner r XOR 2^k, {p2.bit_length() - 1} steps"
        + (f" + {extra} to fold {p - p2} extra rank(s) in and out" if extra else "")
    )
    steps = _sends(page, lambda: minipar.all_reduce(np.ones(8), algorithm="recursive_doubling"))
    page.measurement("who sends to whom")
    page.table(None, ["step>", "messages"], [(s, "  ".join(m)) for s, m in steps.items()])
    page.check(len(steps) == p2.bit_length() - 1 + extra, "recursive doubling step count")


def ledger_section(page: Page) -> None:
    p = page.size
    p2 = 1 << (p.bit_length() - 1)
    count = p * p2 * 256  # float64 elements: every chunking divides evenly
    nbytes = count * 8
    page.measurement(f"the ledger against the formulas, all-reduce of {fmt_bytes(nbytes)}")
    rows, good = [], True
    for a in ALL_REDUCE:
        x = np.ones(count)
        with minipar.trace() as t:
            minipar.all_reduce(x, algorithm=a)
        seen = page.gather((t.steps, t.bytes_sent()))
        steps, sent = max(s for s, _ in seen), max(b for _, b in seen)
        want = cost.traffic("all_reduce", a, nbytes, p)
        ok = steps == want.steps and (
            sent == want.bytes_sent if want.exact else sent <= want.bytes_sent
        )
        good &= ok and bool(np.all(x == p))
        rows.append(
            (
                a,
                want.steps,
                steps,
                fmt_bytes(want.bytes_sent),
                fmt_bytes(sent),
                "yes" if ok else "NO",
            )
        )
    page.table(
        None,
        [
            "algorithm",
            "formula steps>",
            "ledger steps>",
            "formula bytes>",
            "ledger bytes>",
            "match",
        ],
        rows,
        caption="ledger: the busiest rank; double_tree's formula is a bound",
    )
    page.check(good, "every algorithm's ledger matches its formula, and every sum is right")


def time_all_reduce(
    page: Page, algorithm: str, nbytes: int, reps: int, rounds=3, group=None
) -> float:
    """Seconds per call: best of `rounds` timed rounds of `reps` calls, the slowest rank's
    time (the fastest: a round that other processes interrupted is slower, never faster).
    Collective on every rank; with `group`, only its members call (the others wait asleep:
    a rank that spins or yields in a wait still takes turns on the cores the members need)."""
    x = np.ones(max(nbytes // 8, 1))
    member = not isinstance(group, NonMember)  # None: the default group, every rank
    op = (lambda: minipar.all_reduce(x, algorithm=algorithm, group=group)) if member else None
    if op is not None:
        op()  # warm up
    best = float("inf")
    for _ in range(rounds):
        page.comm.barrier()
        t0 = time.perf_counter()
        for _ in range(reps if op is not None else 0):
            op()
        mine = time.perf_counter() - t0
        page.comm.barrier_asleep()  # the ranks not timed wait here asleep, leaving the cores
        best = min(best, max(page.gather(mine)) / reps)
    return best


def timed_ranks(page: Page):
    """(k, group) the crossover is timed on: every rank, or where ranks outnumber cores the
    first `cores` of them, one a core (collective): with more, a step waits for the scheduler
    (a rendezvous message above MPI's eager size for a peer's turn on the core), which the
    model does not price and which no two runs pay alike."""
    k = min(page.size, launcher.cores())
    if k == page.size or k < 2:
        return page.size, None
    return k, minipar.new_group(list(range(k)), name="crossover-timed")


def crossover_section(page: Page) -> None:
    machine = page.machine()
    link = machine.collective
    p, group = timed_ranks(page)
    pair = ("recursive_doubling", "ring")
    n_star = crossover(*pair, p, link)
    timed = ("recursive_doubling", "ring@mpi")  # the ring as ring.py writes it: no fast path
    page.prediction(f"where the ring starts to beat recursive doubling ({link.name})")
    page.say(f"[dim]{machine.basis}[/]")
    page.say(
        f"alpha, a collective step's cost, {fmt_time(link.alpha)}; 1/beta "
        f"{1 / link.beta / 1e9:.3g} GB/s: the model's "
        f"crossover on {p} ranks is at {fmt_bytes(n_star)}. Below it the log2 p latency "
        "terms win; above it the ring's 2(p-1)/p n bytes do."
    )
    if group is not None:
        page.say(
            f"[yellow]{page.size} ranks on {launcher.cores()} cores: both algorithms are timed "
            f"on ranks 0-{p - 1}, one a core (with more ranks than cores a step waits for "
            "the scheduler, which the model does not price), and predicted for them.[/]"
        )
    sizes = [8, 16 << 10, 256 << 10, 4 << 20] if page.quick else [8 << k for k in range(0, 23, 2)]
    rows, winners, judged = [], [], []
    for nbytes in sizes:
        reps = 20 if nbytes <= 64 << 10 else 3
        paired = page.alternate(
            *(partial(time_all_reduce, page, a, nbytes, reps, 2, group) for a in timed),
            3 if page.quick else 5,
        )
        times = paired.seconds
        model = [cost.predict("all_reduce", a, nbytes, p, link) for a in pair]
        winners.append(pair[int(np.argmin(times))])
        rows.append((fmt_bytes(nbytes), *map(fmt_time, model), *map(fmt_time, times), winners[-1]))
        judged.append((nbytes, model, paired))
    page.measurement("both algorithms on this machine, alternated (medians of the pairs)")
    page.table(
        None,
        ["size>", "model rd>", "model ring>", "measured rd>", "measured ring>", "faster"],
        rows,
    )
    knee = link.alpha / link.beta * p
    for nbytes, model, paired in judged:
        tolerance = C.LATENCY_BOUND if nbytes < knee else C.BANDWIDTH_BOUND
        page.ratio_claim(f"recursive doubling / ring at {fmt_bytes(nbytes)}", model[0] / model[1],
                         paired, f"the ring all-reduce of the same {fmt_bytes(nbytes)}",
                         tolerance, basis=machine.basis, timed_on=p)  # fmt: skip


# -- the break-it labs ---------------------------------------------------------------------------


def lab_wrong_chunk(page: Page) -> None:
    r, p = page.rank, page.size
    page.section("Break-it lab: a ring that sends the wrong chunk on its last step")
    if p < 3:
        page.say("Run it on 3 or more ranks (-n 4): with 2 ranks that step has only one chunk.")
        page.failures.append("the lab needs 3 or more ranks")
        return
    page.say("Rank r holds (c+1) * 10^r in chunk c, so the sum of chunk c is (c+1) * 11..1.")
    x = (np.arange(p) + 1) * 10.0**r
    reference = (np.arange(p) + 1) * sum(10.0**q for q in range(p))  # numpy, one process
    with minipar.trace() as t:
        minipar.all_reduce(x, algorithm=planted.all_reduce_ring_wrong_chunk)
    seen = page.gather((x, t.steps, t.bytes_sent()))
    rows, bad = [("sum", *[f"{v:.0f}" for v in reference])], 0
    for q, (buf, _, _) in enumerate(seen):
        wrong = np.flatnonzero(buf != reference)
        bad += len(wrong)
        rows.append(
            (q, *[f"[red]{v:.0f}[/]" if c in wrong else f"{v:.0f}" for c, v in enumerate(buf)])
        )
    page.table(
        "the expected sums, then every rank's chunks after the broken all-reduce",
        ["rank>", *map(str, range(p))],
        rows,
    )
    want = cost.traffic("all_reduce", "ring", p * 8, p)
    ledger_ok = all(s == want.steps and b == want.bytes_sent for _, s, b in seen)
    page.say(
        f"The ledger check cannot see it: steps and bytes match the ring's formula "
        f"({'yes' if ledger_ok else 'no'}). The value check can:"
    )
    page.check(bad > 0, f"checking against numpy's sum caught {bad} wrong chunk(s)")


def lab_last_bit(page: Page) -> None:
    r, p = page.rank, page.size
    page.section("Break-it lab: an all-reduce whose ranks disagree in the last bit")
    if p < 3:
        page.say("Run it on 3 or more ranks: with 2, a+b and b+a are the same bits.")
        page.failures.append("the lab needs 3 or more ranks")
        return
    inputs = [np.random.default_rng(q).standard_normal(1024).astype(np.float32) for q in range(p)]
    exact = np.sum(np.stack(inputs).astype(np.float64), axis=0)
    results = {}
    for name, algorithm in (("planted", planted.all_reduce_own_order), ("minipar ring", "ring")):
        x = inputs[r].copy()
        minipar.all_reduce(x, algorithm=algorithm)
        everyone = page.gather(x)
        close = all(np.allclose(e, exact, rtol=1e-5, atol=1e-5) for e in everyone)
        same = len({planted.float_fingerprint(e) for e in everyone}) == 1
        results[name] = (everyone, close, same)
    everyone = results["planted"][0]
    i = int(np.argmax(np.any(np.stack(everyone) != everyone[0], axis=0)))
    page.table(
        f"element {i} on every rank (planted all-reduce)",
        ["rank>", "value", "bits"],
        [
            (q, f"{e[i]:.9g}", f"{e[i : i + 1].view(np.uint32)[0]:032b}")
            for q, e in enumerate(everyone)
        ],
    )
    page.table(
        None,
        ["all-reduce", "close to the exact sum", "bitwise identical on all ranks"],
        [(n, "yes" if c else "NO", "yes" if s else "NO") for n, (_, c, s) in results.items()],
    )
    page.check(results["planted"][1], "an allclose check passes the planted bug (too weak)")
    page.check(not results["planted"][2], "the bitwise check across ranks catches it")
    page.check(results["minipar ring"][2], "minipar's ring is bitwise identical on every rank")


def main(argv=None) -> int:
    page = Page(
        "03", "Ring and tree algorithms", ("wrong-chunk", "last-bit"), argv=argv, min_ranks=2
    )
    if page.enough and page.lab:
        {"wrong-chunk": lab_wrong_chunk, "last-bit": lab_last_bit}[page.lab](page)
    elif page.enough:
        formulas_section(page, 1 << 20)
        ring_steps_section(page)
        trees_section(page)
        ledger_section(page)
        crossover_section(page)
        page.try_this(
            [
                "Run with -n 5 and -n 8: how do the step tables and the fold of recursive "
                "doubling change?",
                "Write the ring yourself in exercises/ex03_ring_allreduce.py; `minipar grade 03`.",
                "minipar lesson 03 --break wrong-chunk, then --break last-bit: which check "
                "catches which bug, and which check misses it?",
                "Set a faster link with minipar.cost.set_default_link and watch the crossover.",
            ]
        )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
