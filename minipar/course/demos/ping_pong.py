"""Ping-pong: the two numbers every communication cost starts from, latency and bandwidth.

    minipar run -n 2 -m minipar.course.demos.ping_pong [--quick]

Rank 0 sends n bytes to rank 1, rank 1 sends them back: one round trip moves 2n bytes in two
messages. Half the round-trip time is the one-way time t(n) ~ alpha + n * beta: for tiny
messages t is all alpha (latency), for large ones n / t approaches 1 / beta (bandwidth). Each size
is measured twice: through minipar's transport (comm.send/comm.recv: Python checks, the trace
hook and a polling wait that can time out) and through bare mpi4py Send/Recv, so the price of
minipar's layer is visible. Ranks beyond the first two wait.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import minipar
from minipar import cost

SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20]
QUICK_SIZES = [8, 1 << 10, 64 << 10, 1 << 20]


def repetitions(nbytes: int, quick: bool) -> int:
    """Enough round trips for a stable time, about 20 MB moved (fewer when quick)."""
    budget = 4e6 if quick else 2e7
    return int(max(5, min(1000 if quick else 2000, budget / max(nbytes, 4096))))


def round_trips(send, recv, buf, peer: int, first: bool, reps: int) -> float:
    """Seconds per round trip: `first` sends then receives, its peer the other way round."""
    for _ in range(2):  # warm-up: connection setup and first-touch page faults
        (send, recv)[not first](buf, peer)
        (send, recv)[first](buf, peer)
    start = time.perf_counter()
    for _ in range(reps):
        (send, recv)[not first](buf, peer)
        (send, recv)[first](buf, peer)
    return (time.perf_counter() - start) / reps


def measure(comm, raw, sizes, quick: bool) -> list[dict]:
    from mpi4py import MPI

    peer, first = 1 - comm.rank, comm.rank == 0
    rows = []
    for n in sizes:
        buf, reps = np.zeros(n, dtype=np.uint8), repetitions(n, quick)
        ours = round_trips(comm.send, comm.recv, buf, peer, first, reps) / 2
        raw_send = lambda b, p: raw.Send([b, MPI.BYTE], p)
        raw_recv = lambda b, p: raw.Recv([b, MPI.BYTE], p)
        theirs = round_trips(raw_send, raw_recv, buf, peer, first, reps) / 2
        rows.append({"bytes": n, "reps": reps, "minipar": ours, "mpi4py": theirs})
    return rows


def human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}"
        nbytes /= 1024
    return ""  # pragma: no cover


def show(rows) -> None:
    from rich.table import Table

    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    grid = Table(title="ping-pong between rank 0 and rank 1 (one-way time = round trip / 2)")
    for name in ("size", "round trips", "minipar us", "minipar GB/s", "mpi4py us", "mpi4py GB/s"):
        grid.add_column(name, justify="right")
    for r in rows:
        n = r["bytes"]
        grid.add_row(human(n), str(r["reps"]),
                     f"{r['minipar'] * 1e6:.1f}", f"{n / r['minipar'] / 1e9:.2f}",
                     f"{r['mpi4py'] * 1e6:.1f}", f"{n / r['mpi4py'] / 1e9:.2f}")  # fmt: skip
    console = Console(highlight=False)
    console.print(grid)
    alpha, big = rows[0]["minipar"], rows[-1]
    bandwidth = big["bytes"] / (big["minipar"] - alpha)
    link = cost.default_link()
    console.print(
        f"fit t(n) = alpha + n * beta: alpha ~ {alpha * 1e6:.1f} us, 1/beta ~ "
        f"{bandwidth / 1e9:.2f} GB/s  (the cost model's '{link.name}' link assumes "
        f"{link.alpha * 1e6:.0f} us and {1 / link.beta / 1e9:.0f} GB/s)"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="minipar.course.demos.ping_pong")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    args = parser.parse_args(argv)
    comm = minipar.init()
    if comm.size < 2:
        raise SystemExit(
            "ping-pong needs 2 ranks: minipar run -n 2 -m minipar.course.demos.ping_pong"
        )
    pair = comm.split([0, 1], name="ping-pong pair")
    if comm.rank < 2:
        raw = pair.mpi.Dup() if hasattr(pair, "mpi") else None
        rows = measure(pair, raw, QUICK_SIZES if args.quick else SIZES, args.quick)
        if comm.rank == 0:
            show(rows)
    comm.barrier()
    minipar.finalize()


if __name__ == "__main__":
    main()
