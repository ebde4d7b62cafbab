"""How a buffer of n elements is cut into p chunks: the first n % p chunks get one extra element.

    bounds(10, 4) == (0, 3, 6, 8, 10)    # chunks of 3, 3, 2, 2

Every chunked algorithm (ring, Rabenseifner, double tree) uses this one rule, so the ledger's byte
counts are predictable: with n divisible by p each chunk is exactly n / p.
"""

import functools


@functools.lru_cache(maxsize=256)
def bounds(n: int, p: int) -> tuple[int, ...]:
    # a tuple, cached: the 4,096 simulated ranks of one ring share one copy (a list each: 750 MB)
    base, extra = divmod(n, p)
    edges = [0]
    for c in range(p):
        edges.append(edges[-1] + base + (1 if c < extra else 0))
    return tuple(edges)


def chunk(x, edges, c: int):
    """Chunk c of the flat buffer x (a view)."""
    return x[edges[c] : edges[c + 1]]


def fold(p: int) -> tuple[int, int]:
    """(p2, rem): the largest power of two p2 <= p, and rem = p - p2 ranks to fold in first.

    MPICH's way to run a power-of-two algorithm on any p: of the first 2*rem ranks, each even one
    hands its data to the odd one above it and sits out; the p2 ranks left are renumbered
    0..p2-1 (`folded_rank`), run the algorithm, and the odd ones hand the result back.
    """
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2


def folded_rank(rank: int, rem: int) -> int | None:
    """This rank's number among the p2 that take part, or None if it sits out."""
    if rank < 2 * rem:
        return rank // 2 if rank % 2 else None
    return rank - rem


def unfolded_rank(new: int, rem: int) -> int:
    """The original rank of participant `new`."""
    return 2 * new + 1 if new < rem else new + rem


def covered(new: int, rem: int) -> tuple[int, int]:
    """The original ranks [first, last) whose data participant `new` stands for."""
    return (2 * new, 2 * new + 2) if new < rem else (new + rem, new + rem + 1)
