"""Whose data an element holds: inputs chosen so that a collective's result names its sources.

Lesson 03 gives rank r the value 10^r, so a sum's digits say which ranks it contains. The grader
does the same with base 8 and adds the element's index, so that a wrong result says whose data,
and from which element, it holds:

    x = whose.sum_input(rank, p, n)        # element i of rank r: 8^r + 8^p * i  (float64)
    after a SUM all-reduce element i is  sum over ranks of 8^r  +  p * 8^p * i:
    whose.sum_words(value, p, i)  ->  "the sum of ranks {0, 1, 3}"   ("element 5's sum ..." if
                                                                  it came from element 5, not i)

    x = whose.copy_input(rank, n)          # element i of rank r: (r + 1) * 2^20 + i
    whose.copy_words(value)    ->  "rank 2's element 5"

    whose.first_wrong(got, want, words, rank)
        -> "rank 0, element 4: holds the sum of ranks {1} but should hold the sum of ranks {0, 1}"

Exact in float64 while 8^p * p * n < 2^53 (p <= 12 ranks of 1000 elements); a value that does
not decode (a rank counted 8 times, a fraction) is shown as the number itself.
"""

from __future__ import annotations

import numpy as np

BASE = 8
COPY = 1 << 20


def sum_input(rank: int, p: int, n: int) -> np.ndarray:
    return BASE**rank + float(BASE**p) * np.arange(n, dtype=np.float64)


def copy_input(rank: int, n: int, dtype=np.float64) -> np.ndarray:
    return ((rank + 1) * COPY + np.arange(n)).astype(dtype)


def _ranks(counts: list[int]) -> str:
    return "{" + ", ".join(str(r) for r, k in enumerate(counts) for _ in range(k)) + "}"


def sum_words(value: float, p: int, index: int | None = None) -> str:
    """What a SUM of sum_input()s holds: 'the sum of ranks {0, 1}' ("element j's sum of ranks
    {0, 1}" when it came from element j, not `index`)."""
    if value != value or value < 0 or value != int(value):
        return f"{value:g}"
    high, low = divmod(int(value), BASE**p)
    counts = [(low // BASE**r) % BASE for r in range(p)]
    total = sum(counts)
    if total == 0:
        return "nothing (0)" if high == 0 else f"{value:g}"
    element, rest = divmod(high, total)
    if rest:
        return f"{value:g}"
    moved = index is not None and element != index
    whose_sum = f"element {element}'s" if moved else "the"
    return f"{whose_sum} sum of ranks {_ranks(counts)}"


def copy_words(value: float, index: int | None = None) -> str:
    """What a copy of copy_input()s holds: "rank 2's element 5" (or the number itself)."""
    if value != value or value != int(value):
        return f"{value:g}"
    rank, element = divmod(int(value), COPY)
    if rank < 1:
        return f"{value:g} (never written)" if value < 0 else f"{value:g}"
    return f"rank {rank - 1}'s element {element}"


def first_wrong(got, want, words, rank: int, name: str = "element") -> str | None:
    """'rank 0, element 4: holds X but should hold Y' for the first element of `got` that differs
    from `want` (words(value, index) puts a value into words); None if none differs."""
    got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    wrong = np.flatnonzero(got != want)
    if not len(wrong):
        return None
    i = int(wrong[0])
    more = f" ({len(wrong)} elements wrong)" if len(wrong) > 1 else ""
    return (
        f"rank {rank}, {name} {i}: holds {words(got[i].item(), i)} but should hold "
        f"{words(want[i].item(), i)}{more}"
    )
