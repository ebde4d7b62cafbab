"""Whose data an element holds: inputs chosen so that a collective's result names its sources.

Lesson 03 gives rank r the value 10^r, so a sum's digits say which ranks it contains. The grader
gives each rank a field of its own (a digit in base W = 2^(53 // p)), and in it two numbers: how
many times the rank was added (below K + 1) and the sum of the element indices it came from:

    x = whose.sum_input(rank, p, n)        # element i of rank r: W^r (1 + (K + 1) i)  (float64)
    after a SUM, rank r's field holds  c_r + (K + 1) s_r:  c_r times rank r, elements adding to s_r
    whose.sum_words(value, p, i)  ->  "the sum of ranks {0, 1, 3}"   ("element 5's sum ..." if
                                       every rank's part came from element 5, not i; else each
                                       rank's own: "rank 0's element 0 + rank 1's element 4")

    x = whose.copy_input(rank, n)          # element i of rank r: (r + 1) * 2^20 + i
    whose.copy_words(value)    ->  "rank 2's element 5"

    whose.first_wrong(got, want, words, rank)
        -> "rank 0, element 4: holds the sum of ranks {1} but should hold the sum of ranks {0, 1}"

A sum decodes uniquely while every rank is added at most K times (K = 3 up to 5 ranks, 1 above)
and its fields stay below W (sum_input refuses an n too large for p: p <= 4 takes 683 elements,
p = 8 takes 32); the fields are exact in float64 (W^p <= 2^53). A value that does not decode (a
negative, a fraction, a rank with no count but an index) is shown as the number itself.
"""

from __future__ import annotations

import numpy as np

COPY = 1 << 20


def _layout(p: int) -> tuple[int, int]:
    """(W, K): each rank's field is a digit in base W; counts up to K decode."""
    if p < 1:
        raise ValueError(f"whose: p must be at least 1 rank, got {p}")
    return 1 << (53 // p), 3 if p <= 5 else 1


def _capacity(p: int) -> int:
    """The most elements sum_input gives each of p ranks: K copies of the last index fit W."""
    w, k = _layout(p)
    return (w - 1 - k) // ((k + 1) * k) + 1


def sum_input(rank: int, p: int, n: int) -> np.ndarray:
    """Element i of `rank`: one count (1) and the index i in rank's own field (docstring)."""
    w, k = _layout(p)
    if n > _capacity(p):
        raise ValueError(
            f"whose.sum_input: {n} elements on {p} ranks do not decode in float64; at most "
            f"{_capacity(p)} on {p} ranks"
        )
    return float(w) ** rank * (1 + (k + 1) * np.arange(n, dtype=np.float64))


def copy_input(rank: int, n: int, dtype=np.float64) -> np.ndarray:
    return ((rank + 1) * COPY + np.arange(n)).astype(dtype)


def _ranks(counts: list[int]) -> str:
    return "{" + ", ".join(str(r) for r, k in enumerate(counts) for _ in range(k)) + "}"


def _fields(value: float, p: int) -> list[tuple[int, int]] | None:
    """[(c_r, s_r)] per rank of a SUM of sum_input()s, or None where it does not decode."""
    if value != value or value < 0 or value != int(value) or value >= 2**53:
        return None
    w, k = _layout(p)
    rest, fields = int(value), []
    for _ in range(p):
        rest, field = divmod(rest, w)
        count, indices = field % (k + 1), field // (k + 1)
        if count == 0 and indices:
            return None
        fields.append((count, indices))
    return None if rest else fields


def sum_words(value: float, p: int, index: int | None = None) -> str:
    """What a SUM of sum_input()s holds: 'the sum of ranks {0, 1}' ("element j's sum of ranks
    {0, 1}" when every rank's part came from element j, not `index`; "rank 0's element 0 +
    rank 1's element 4" when the ranks' parts came from different elements)."""
    fields = _fields(value, p)
    if fields is None:
        return f"{value:g}"
    counts = [c for c, _ in fields]
    if not any(counts):
        return "nothing (0)"
    elements = {s for c, s in fields if c == 1}
    if set(counts) <= {0, 1} and len(elements) == 1:  # one element of each rank: which one
        element = elements.pop()
        whose_sum = "the" if index in (None, element) else f"element {element}'s"
        return f"{whose_sum} sum of ranks {_ranks(counts)}"
    # a rank added twice says only what its indices add up to: 2 + 4 and 3 + 3 look alike
    times = {2: "twice"}
    parts = [
        f"rank {r}'s element {s}"
        if c == 1
        else f"rank {r} {times.get(c, f'{c} times')} (elements adding up to {s})"
        for r, (c, s) in enumerate(fields)
        if c
    ]
    return " + ".join(parts)


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
