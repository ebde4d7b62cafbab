"""The same error from many ranks, said once: `[rank 0, 1] x.py line 5: ValueError: ...`.

An SPMD program that goes wrong usually goes wrong alike on every rank: a misspelt algorithm
raises the same ValueError on each, `python nosuch.py` fails to start on each. Relayed as they
are, 2 ranks print 40 lines (each rank's traceback, minipar's "aborting" line, MPI's abort line)
around one clear error. The relay (relay.py) hands each rank's stderr lines to a Fold, which
holds a rank's uncaught-exception block (minipar's excepthook: `[rank R] Traceback ...` up to
`[rank R] minipar: aborting the job after an uncaught exception`) and Python's start-up
failures (`can't open file`, `No module named`) for HOLD seconds, so the other ranks' copies
join them, then writes each distinct error once:

    two or more ranks alike   one line: the ranks, the error, where in the program it was raised
    one rank                  its lines as they were (the whole traceback)

MPI's own abort lines (`Abort(1) on node 0 ...: application called MPI_Abort`, the PMI client's
`write_line error` of a second rank's abort) are dropped once a rank said minipar aborts the
job: minipar's line already says why. Every other line passes at
once, unchanged.
"""

from __future__ import annotations

import os
import re
import time

HOLD = 0.5  # seconds an error waits for the same from other ranks
BLOCK_START = re.compile(r"^\[rank (\d+)\] Traceback \(most recent call last\):$")
ABORTING = "minipar: aborting the job after an uncaught exception"
# MPI's own lines as a job aborts: MPICH's abort line, and the PMI client's of a rank whose
# abort reached a launcher already ending the job (a write_line error, ":", the system's why)
MPI_ABORT = re.compile(
    r"^(Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\): application called|"
    r"\[[^\]]*\]: write_line error|system msg for write_line failure|:$)"
)
START_FAILURE = re.compile(r"can't open file|No module named|can't find '__main__' module")
FRAME = re.compile(r'^  File "([^"]+)", line (\d+)')
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # minipar/


class Fold:
    """Each rank's stderr lines in, the lines to write out (now, when due, at the end)."""

    def __init__(self, n: int):
        self.n = n
        self.blocks: dict[int, list[str]] = {}  # rank -> its open exception block
        self.groups: dict[str, dict] = {}  # error text -> {"ranks", "lines", "since"}
        self.aborting = False  # a rank said minipar aborts the job

    def line(self, rank: int, text: str) -> list[str]:
        """What to write now for one whole line (newline kept) of rank's stderr."""
        body = text.rstrip("\n")
        block = self.blocks.get(rank)
        if block is not None:
            if body.startswith(f"[rank {rank}] "):
                block.append(text)
                if body.endswith(ABORTING):
                    self._close(rank)
                return []
            self._close(rank)  # a line of another kind: the block ended without the word
        if BLOCK_START.match(body):
            self.blocks[rank] = [text]
            return []
        if self.aborting and MPI_ABORT.match(body):
            return []
        if START_FAILURE.search(body):
            self._add(body, rank, [text])
            return []
        return [text]

    def due(self, now: float | None = None) -> list[str]:
        """The groups whose wait is over (or that every rank joined), rendered."""
        now = time.monotonic() if now is None else now
        ready = [k for k, g in self.groups.items()
                 if now - g["since"] >= HOLD or len(g["ranks"]) >= self.n]  # fmt: skip
        return [line for key in ready for line in _render(key, self.groups.pop(key))]

    def end(self) -> list[str]:
        """Everything still held, once the job's streams are drained."""
        for rank in list(self.blocks):
            self._close(rank)
        return self.due(float("inf"))

    def _close(self, rank: int) -> None:
        lines = self.blocks.pop(rank)
        self.aborting = self.aborting or lines[-1].rstrip("\n").endswith(ABORTING)
        self._add(_error_text(lines, rank), rank, lines)

    def _add(self, key: str, rank: int, lines: list[str]) -> None:
        group = self.groups.setdefault(
            key, {"ranks": [], "lines": lines, "since": time.monotonic()}
        )
        group["ranks"].append(rank)


def _strip(line: str, rank: int) -> str:
    return line.rstrip("\n").removeprefix(f"[rank {rank}] ")


def _error_text(lines: list[str], rank: int) -> str:
    """The exception's own lines, without the rank: what follows the last frame (its `  File`
    line and the source and caret lines indented under it); the message's own indented lines
    (a MismatchError's calls) are kept."""
    body = [_strip(line, rank) for line in lines]
    body = [line for line in body if line != ABORTING]
    frames = [i for i, line in enumerate(body) if line.startswith('  File "')]
    start = frames[-1] + 1 if frames else 1
    while start < len(body) and body[start].startswith("    "):
        start += 1
    return "\n".join(body[start:]) or body[-1]


def _where(lines: list[str]) -> str:
    """' x.py line 5:': the innermost frame outside minipar's own package, if any."""
    found = ""
    for line in lines:
        match = FRAME.match(re.sub(r"^\[rank \d+\] ", "", line))
        if match and not os.path.abspath(match.group(1)).startswith(PACKAGE + os.sep):
            path = match.group(1)
            relative = os.path.relpath(path) if os.path.isabs(path) else path
            shown = path if relative.startswith("..") else relative
            found = f" {shown} line {match.group(2)}:"
    return found


def ranks_text(ranks: list[int]) -> str:
    """'rank 0, 1' or 'rank 0-3' (a run of three or more), in order."""
    ranks, parts, i = sorted(set(ranks)), [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ranks[i]}-{ranks[j]}")
        else:
            parts += [str(r) for r in ranks[i : j + 1]]
        i = j + 1
    return "rank " + ", ".join(parts)


def _render(key: str, group: dict) -> list[str]:
    if len(group["ranks"]) == 1:
        return group["lines"]
    first, *rest = key.split("\n")
    where = _where(group["lines"]) if BLOCK_START.match(group["lines"][0].rstrip("\n")) else ""
    return [f"[{ranks_text(group['ranks'])}]{where} {first}\n", *(line + "\n" for line in rest)]
