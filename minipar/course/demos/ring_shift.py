"""Ring shift: every rank passes what it holds to its right-hand neighbour, p - 1 times.

    minipar run -n 4 -m minipar.course.demos.ring_shift

Rank r starts with one letter (rank 0 'A', rank 1 'B', ...). In each step every rank sends the
letter it received last (its own, at first) to rank r+1 and receives a new one from rank r-1,
with one `sendrecv` so nobody waits for a send to finish before receiving: all p links are busy
at once. After p - 1 steps every rank has seen every letter. That is the all-gather of the ring
algorithm, and the same pattern, with blocks of a tensor instead of letters, is the second half of
the ring all-reduce (collectives/ring.py).

    step 1:  A->1  B->2  C->3  D->0
    step 2:  D->1  A->2  B->3  C->0   (each forwards what it just received)

Each rank sends p - 1 messages of one byte in p - 1 steps; rank 0 prints who sent what to whom.
"""

from __future__ import annotations

import numpy as np

import minipar


def shift(comm) -> list[dict]:
    """Run the p - 1 steps; return this rank's log: (step, sent, to, got, from)."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    holding = np.array([ord("A") + comm.rank], dtype=np.uint8)
    incoming = np.zeros(1, dtype=np.uint8)
    log = []
    for step in range(1, comm.size):
        comm.sendrecv(holding, right, incoming, left)
        log.append({"step": step, "sent": chr(holding[0]), "to": right,
                    "got": chr(incoming[0]), "from": left})  # fmt: skip
        holding[:] = incoming
    return log


def show(logs: list[list[dict]], bytes_sent: list[int]) -> None:
    from rich.table import Table

    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    p = len(logs)
    grid = Table(title=f"ring shift on {p} ranks", caption="rank r sends to r+1, receives from r-1")
    grid.add_column("step", justify="right")
    for rank in range(p):
        grid.add_column(f"rank {rank}", justify="center")
    for i in range(p - 1):
        cells = [f"{logs[r][i]['sent']} -> {logs[r][i]['to']}\n"
                 f"{logs[r][i]['got']} <- {logs[r][i]['from']}" for r in range(p)]  # fmt: skip
        grid.add_row(str(i + 1), *cells, end_section=True)
    seen = ["".join(sorted({chr(ord("A") + r)} | {e["got"] for e in logs[r]})) for r in range(p)]
    grid.add_row("has", *seen, style="bold")
    grid.add_row("bytes", *[str(b) for b in bytes_sent], style="dim")
    console = Console(highlight=False)
    console.print(grid)
    console.print(
        f"'X -> k': sent letter X to rank k; 'Y <- j': received Y from rank j. "
        f"{p - 1} steps, {p - 1} bytes sent per rank, every link busy in every step."
    )


def main() -> None:
    comm = minipar.init()
    with minipar.trace() as t:
        log = shift(comm)
    everyone = comm.allgather_object((log, t.bytes_sent()))
    letters = {chr(ord("A") + r) for r in range(comm.size)}
    for rank, (entries, _) in enumerate(everyone):
        have = {chr(ord("A") + rank)} | {e["got"] for e in entries}
        if have != letters:
            raise AssertionError(f"rank {rank} ended with {sorted(have)}, not all of {letters}")
    if comm.rank == 0:
        show([e for e, _ in everyone], [b for _, b in everyone])
    minipar.finalize()


if __name__ == "__main__":
    main()
