"""All-reduce, several ways: the trace ledger's steps and bytes against the cost model's formulas.

    minipar run -n 4 -m minipar.course.demos.all_reduce [--quick] [--sizes 4096 4194304]

Every rank holds a vector of n bytes; afterwards every rank holds the element-wise sum. The
algorithms differ in how many rounds (steps) they take and how many bytes the busiest rank sends:

    linear               everyone -> rank 0, rank 0 -> everyone   2(p-1) steps, (p-1) n bytes
    tree                 reduce up a binomial tree, broadcast down   2 log p steps, n log p bytes
    recursive_doubling   exchange whole vectors with rank ^ 2^k        log p steps, n log p bytes
    ring                 reduce-scatter, then all-gather, in blocks  2(p-1) steps, 2(p-1)/p n bytes
    rabenseifner         recursive halving, then doubling             2 log p steps, ~2n bytes

Latency (alpha per step) favours few steps for small vectors; bandwidth (beta per byte) favours
the ring for large ones. For each size, rank 0 prints what the ledger counted on the busiest rank
next to `minipar.cost.traffic`, and the measured time next to `minipar.cost.predict`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import minipar
from minipar import cost


def run_one(comm, algorithm: str, n_elements: int, reps: int) -> dict:
    """One traced call (checked against the exact sum), then `reps` timed ones; this rank's view."""
    p, base = comm.size, np.arange(n_elements, dtype=np.float32) % 97
    x = base + comm.rank
    with minipar.trace() as t:
        minipar.all_reduce(x, algorithm=algorithm)
    correct = bool(np.array_equal(x, p * base + p * (p - 1) / 2))
    best = float("inf")
    for _ in range(reps):
        comm.barrier()
        start = time.perf_counter()
        minipar.all_reduce(x, algorithm=algorithm)
        best = min(best, time.perf_counter() - start)
    call = t.calls[0]
    return {"algorithm": call.algorithm, "steps": call.steps, "bytes": call.bytes_sent,
            "seconds": best, "correct": correct}  # fmt: skip


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""  # pragma: no cover


def agrees(row: dict, model) -> bool:
    """The ledger matches the formula: exactly, or within its bound where the formula is one."""
    sent_ok = row["bytes"] == model.bytes_sent if model.exact else row["bytes"] <= model.bytes_sent
    return row["steps"] == model.steps and sent_ok


def show(nbytes: int, p: int, rows: list[dict], auto: str) -> None:
    from rich.table import Table

    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    link = cost.default_link()
    grid = Table(
        title=f"all_reduce of {_bytes(nbytes)} on {p} ranks: ledger vs cost model",
        caption="ledger: the busiest rank's trace; model: minipar.cost.traffic and .predict",
    )
    grid.add_column("algorithm", no_wrap=True)
    for name in ("steps", "bytes sent", "time ms", "agree"):
        grid.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        model = cost.traffic("all_reduce", r["algorithm"], nbytes, p)
        agree = agrees(r, model)
        predicted = cost.predict("all_reduce", r["algorithm"], nbytes, p, link)
        mark = "[green]yes[/]" if agree else "[bold red]no[/]"
        if not r["correct"]:
            mark = "[bold red]WRONG SUM[/]"
        grid.add_row(r["algorithm"], f"{r['steps']} / {model.steps}",
                     f"{_bytes(r['bytes'])} / {'<=' * (not model.exact)}"
                     f"{_bytes(model.bytes_sent)}",
                     f"{r['seconds'] * 1e3:.2f} / {predicted * 1e3:.2f}", mark)  # fmt: skip
    console = Console(highlight=False)
    console.print(grid)
    fastest = min(rows, key=lambda r: r["seconds"])["algorithm"]
    console.print(
        f"measured fastest: {fastest}; algorithm='auto' picks {auto} (cost model, link "
        f"'{link.name}': {link.alpha * 1e6:.0f} us/step, {1 / link.beta / 1e9:.0f} GB/s)"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="minipar.course.demos.all_reduce")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 4 << 20], metavar="BYTES")
    args = parser.parse_args(argv)
    comm = minipar.init()
    names = [a for a in minipar.algorithms("all_reduce") if a != "auto"]
    failures = []
    for nbytes in args.sizes:
        reps = 3 if args.quick else 10
        unit = comm.size * (1 << (comm.size.bit_length() - 1))  # even blocks: exact formulas
        n_elements = max(unit, nbytes // 4 // unit * unit)
        nbytes = 4 * n_elements
        mine = [run_one(comm, name, n_elements, reps) for name in names]
        everyone = comm.allgather_object(mine)
        rows = [{"algorithm": name,
                 "steps": max(rank[i]["steps"] for rank in everyone),
                 "bytes": max(rank[i]["bytes"] for rank in everyone),
                 "seconds": max(rank[i]["seconds"] for rank in everyone),
                 "correct": all(rank[i]["correct"] for rank in everyone)}
                for i, name in enumerate(names)]  # fmt: skip
        failures += [f"{r['algorithm']} (wrong sum)" for r in rows if not r["correct"]]
        failures += [
            f"{r['algorithm']} (ledger != model at {nbytes} bytes)"
            for r in rows
            if not agrees(r, cost.traffic("all_reduce", r["algorithm"], nbytes, comm.size))
        ]
        if comm.rank == 0:
            auto = cost.choose("all_reduce", names, nbytes, comm.size)
            show(nbytes, comm.size, rows, auto)
    minipar.finalize()
    if failures:
        raise SystemExit(f"all_reduce check failed: {', '.join(failures)}")


if __name__ == "__main__":
    main()
