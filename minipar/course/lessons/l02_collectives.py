"""Lesson 02: ranks, point-to-point, and the collective zoo (text: lessons/02_collectives.md).

    minipar lesson 02 -n 4                    # python -m minipar.course.lessons.l02_collectives
    minipar lesson 02 --break send-first      # the deadlock lab

Rank r starts with x = [10r, 10r+1, ..., 10r+p-1], so every number says where it came from
(tens: the rank, units: the position). For a ring shift and each of the eight collectives the
lesson first predicts, with numpy on one process, what every rank will hold, then runs minipar's
collective and prints each rank's buffer before and after, with the messages the ledger saw.
"""

from __future__ import annotations

import os
import socket
import time
import traceback

import numpy as np

import minipar
from minipar import cost
from minipar.comm.transport.base import Request
from minipar.course.lessons import planted
from minipar.course.lessons.page import Page, fmt_bytes, fmt_time
from minipar.errors import CommTimeoutError

ROOT = 1  # the rooted collectives use rank 1, so "root" never reads as "rank 0"


def start(r: int, p: int) -> np.ndarray:
    """Rank r's starting vector: [10r, 10r+1, ..., 10r+p-1]."""
    return np.arange(p, dtype=np.int64) + 10 * r


def show(a) -> str:
    return "-" if a is None else "[" + " ".join(str(v) for v in np.asarray(a).tolist()) + "]"


def expected(name: str, p: int) -> list:
    """What each rank holds after the collective, computed with numpy on one process."""
    xs = np.stack([start(r, p) for r in range(p)])  # row r = rank r's vector
    total = xs.sum(axis=0)
    table = {
        "broadcast": [xs[ROOT]] * p,
        "scatter": [xs[ROOT][r : r + 1] for r in range(p)],
        "gather": [xs[:, 0] if r == ROOT else None for r in range(p)],
        "reduce": [total if r == ROOT else xs[r] for r in range(p)],
        "all_gather": [xs[:, 0]] * p,
        "all_reduce": [total] * p,
        "reduce_scatter": [total[r : r + 1] for r in range(p)],
        "all_to_all": [xs[:, r] for r in range(p)],
    }
    return table[name]


WHAT = {
    "broadcast": f"rank {ROOT}'s vector copied to all",
    "scatter": f"rank {ROOT}'s vector dealt out, element r to rank r",
    "gather": f"everyone's first element collected on rank {ROOT}",
    "reduce": f"everyone's vector summed, on rank {ROOT} only",
    "all_gather": "everyone's first element collected on every rank",
    "all_reduce": "everyone's vector summed, on every rank",
    "reduce_scatter": "the sum, element r of it on rank r",
    "all_to_all": "element j of rank i goes to position i of rank j (a transpose)",
}


def claims() -> list[str]:
    """Buffers lessons/02_collectives.md quotes for 4 ranks; tests/test_lessons.py checks them."""
    return [
        show(start(2, 4)),
        show(expected("all_reduce", 4)[0]),
        show(expected("all_to_all", 4)[1]),
        show(expected("gather", 4)[ROOT]),
    ]


def run(name: str, r: int, p: int):
    """Run collective `name` on this rank: (before, after) buffers."""
    x = start(r, p)
    before, one = x.copy(), x[:1].copy()
    if name == "broadcast":
        minipar.broadcast(x, src=ROOT)
        return before, x
    if name == "scatter":
        out = np.empty(1, np.int64)
        blocks = [x[j : j + 1].copy() for j in range(p)] if r == ROOT else None
        minipar.scatter(out, blocks, src=ROOT)
        return before, out
    if name == "gather":
        got = [np.empty(1, np.int64) for _ in range(p)] if r == ROOT else None
        minipar.gather(one, got, dst=ROOT)
        return one, (np.concatenate(got) if got else None)
    if name == "reduce":
        minipar.reduce(x, dst=ROOT)
        return before, x
    if name == "all_gather":
        out = np.empty(p, np.int64)
        minipar.all_gather_into_tensor(out, one)
        return one, out
    if name == "all_reduce":
        minipar.all_reduce(x)
        return before, x
    if name == "reduce_scatter":
        out = np.empty(1, np.int64)
        minipar.reduce_scatter_tensor(out, x)
        return before, out
    out = np.empty(p, np.int64)
    minipar.all_to_all_single(out, x)
    return before, out


def ranks_section(page: Page) -> None:
    page.section("Ranks: who is here")
    rows = page.gather((page.rank, page.size, socket.gethostname(), os.getpid()))
    page.table(None, ["rank>", "world size>", "host", "pid>"], rows)


def ring_shift_section(page: Page) -> None:
    comm, r, p = page.comm, page.rank, page.size
    page.prediction("a ring shift: rank r sends x to r+1 and receives from r-1")
    x, out = start(r, p), np.zeros(p, np.int64)
    want = [start((q - 1) % p, p) for q in range(p)]
    page.table(
        None,
        ["rank>", "before", "will receive"],
        [(q, show(start(q, p)), show(want[q])) for q in range(p)],
    )
    comm.sendrecv(x, (r + 1) % p, out, (r - 1) % p)  # both posted before either waits
    got = page.gather(out)
    page.measurement("after comm.sendrecv(x, right, out, left)")
    page.table(
        None,
        ["rank>", "received", "ok"],
        [(q, show(got[q]), "yes" if np.array_equal(got[q], want[q]) else "NO") for q in range(p)],
    )
    page.check(
        all(np.array_equal(g, w) for g, w in zip(got, want)),
        "every rank got its left neighbour's vector",
    )


def zoo_section(page: Page) -> None:
    p = page.size
    page.prediction("the collective zoo, and what auto will pick for these 8-byte elements")
    rows = []
    for name, what in WHAT.items():
        rows.append((name, what))
    page.table(None, ["collective", "what every rank ends with"], rows)
    for name in WHAT:
        want = expected(name, p)
        with minipar.trace() as t:
            before, after = run(name, page.rank, p)
        sends = [f"{page.rank}->{m.peer}" for m in t.messages if m.kind == "send"]
        report = page.gather((before, after, sends, t.algorithms, t.bytes_sent(), t.steps))
        ok = [_same(rep[1], w) for rep, w in zip(report, want)]
        page.section(f"{name}: {WHAT[name]}")
        page.table(
            None,
            ["rank>", "before", "predicted", "after (minipar)", "ok", "sent bytes>", "steps>"],
            [
                (
                    q,
                    show(rep[0]),
                    show(want[q]),
                    show(rep[1]),
                    "yes" if ok[q] else "NO",
                    rep[4],
                    rep[5],
                )
                for q, rep in enumerate(report)
            ],
            caption=f"algorithm {report[0][3][0]}; messages "
            + " ".join(m for rep in report for m in rep[2]),
        )
        page.check(all(ok), f"{name}: every rank holds the predicted buffer")


def _same(got, want) -> bool:
    if got is None or want is None:
        return got is None and want is None
    return np.array_equal(got, want)


def traffic_section(page: Page) -> None:
    """The cost model's bytes for a 1 MiB buffer, per collective (the sizes lesson 03 checks)."""
    p, n = page.size, 1 << 20
    page.section(f"What each collective costs, for a {fmt_bytes(n)} buffer on {p} ranks")
    rows = []
    for name, algorithm in (
        ("broadcast", "tree"),
        ("reduce", "tree"),
        ("all_gather", "ring"),
        ("reduce_scatter", "ring"),
        ("all_reduce", "ring"),
        ("all_to_all", "pairwise"),
    ):
        t = cost.traffic(name, algorithm, n, p)
        rows.append((name, algorithm, t.steps, fmt_bytes(t.bytes_sent)))
    page.table(None, ["collective", "algorithm", "steps>", "sent by the busiest rank>"], rows)


def _stuck_requests(error) -> list:
    """The requests still posted when `error` was raised, found in its traceback's frames."""
    found = []
    for frame, _ in traceback.walk_tb(error.__traceback__):
        for value in frame.f_locals.values():
            if isinstance(value, Request) and value not in found:
                found.append(value)
    return found


def lab_send_first(page: Page) -> None:
    """A ring shift that sends before it receives: fine at 4 KiB, deadlocked at 8 MiB."""
    comm, r, p = page.comm, page.rank, page.size
    page.section("Break-it lab: send first, then receive (minipar.course.lessons.planted)")
    page.say("Every rank calls comm.send(x, right) and only then comm.recv(out, left).")
    saved, comm.timeout = comm.timeout, 1.0
    try:
        for nbytes in (4 << 10, 8 << 20):
            x, out = np.full(nbytes // 8, r, np.int64), np.zeros(nbytes // 8, np.int64)
            t0, error = time.perf_counter(), None
            try:
                planted.ring_shift_send_first(comm, x, out)
            except CommTimeoutError as e:
                error = e
                comm.recv(out, (r - 1) % p)  # the late receive unblocks the left neighbour
                for request in _stuck_requests(e):
                    request.wait()  # MPI wants every posted message completed before exit
            comm.barrier()
            seconds = time.perf_counter() - t0
            rows = page.gather((str(error) if error else "finished", seconds, int(out[0])))
            del error
            page.table(
                f"{fmt_bytes(nbytes)} per message",
                ["rank>", "outcome", "time>"],
                [(q, o, fmt_time(s)) for q, (o, s, _) in enumerate(rows)],
            )
            stuck = sum(o != "finished" for o, _, _ in rows)
            if nbytes < 8 << 20:
                page.check(stuck == 0, "4 KiB: no rank stuck (MPI buffered the small sends)")
            else:
                page.check(
                    stuck > 0,
                    f"8 MiB: the timeout caught the deadlock ({stuck} rank(s) "
                    "gave up waiting and named the message)",
                )
    finally:
        comm.timeout = saved
    page.say("The fix: comm.sendrecv(x, right, out, left), as the lesson's ring shift does.")


def main(argv=None) -> int:
    page = Page(
        "02",
        "Ranks, point-to-point and the collective zoo",
        ("send-first",),
        argv=argv,
        min_ranks=2,
    )
    if page.enough and page.lab == "send-first":
        lab_send_first(page)
    elif page.enough:
        ranks_section(page)
        ring_shift_section(page)
        zoo_section(page)
        if not page.quick:
            traffic_section(page)
        page.try_this(
            [
                "Change ROOT to 3 (or run with -n 5): which rows of the tables change?",
                "Pass algorithm='linear' in run() and compare the message lists with the tree's.",
                "Write the ring shift yourself: exercises/ex02_ring_shift.py, then "
                "`minipar grade 02`.",
                "minipar lesson 02 --break send-first: why does the small message get through?",
            ]
        )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
