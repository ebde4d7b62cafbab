"""The alpha-beta-gamma cost model: how long a collective should take, from three numbers.

    time = steps * alpha  +  bytes_sent * beta  +  bytes_reduced * gamma

alpha is the cost of one message (latency), beta the cost of one byte on the link (1/bandwidth),
gamma the cost of reducing one byte (1/reduction rate). `traffic()` counts steps and bytes for
each (collective, algorithm) from the same formulas the algorithms' docstrings state and the
tests check against the trace ledger; `predict()` prices them on a `Link`.
(Hockney 1994; Thakur, Rabenseifner and Gropp 2005; Patarasuk and Yuan 2009.)

nbytes is the size of the whole buffer, as in nccl-tests: the vector being reduced or broadcast,
the full output of an all-gather, the full input of a reduce-scatter, the root's buffer of a
scatter or gather, one rank's whole send buffer of an all-to-all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SEGMENT_BYTES = 1 << 18  # must match collectives.ring.SEGMENT_BYTES (checked by a test)


@dataclass(frozen=True)
class Link:
    """alpha: seconds per message; beta: seconds per byte sent; gamma: seconds per byte reduced."""

    name: str
    alpha: float
    beta: float
    gamma: float
    source: str = ""


# What minipar's Python algorithms over the mpich wheel's shared memory cost on a laptop-class
# CPU: ~20 us per step (mostly Python and mpi4py call overhead), ~5 GB/s per message copy,
# ~5 GB/s numpy reduction. `minipar bench --fit` measures the real numbers of a machine.
SHARED_MEMORY = Link("shared-memory", alpha=20e-6, beta=1 / 5e9, gamma=1 / 5e9, source="typical")

_default = [SHARED_MEMORY]


def default_link() -> Link:
    """The link `algorithm="auto"` prices with. Set it the same on every rank."""
    return _default[0]


def set_default_link(link: Link) -> None:
    _default[0] = link


@dataclass(frozen=True)
class Traffic:
    steps: int  # rounds of the algorithm (the ledger's steps, max over ranks)
    bytes_sent: float  # by the busiest rank
    bytes_reduced: float  # by the busiest rank
    exact: bool = True  # False: bytes_sent is an upper bound (uneven splits, folded ranks)


def _log2ceil(p: int) -> int:
    return (p - 1).bit_length()


def _fold(p: int) -> tuple[int, int]:
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2


def traffic(collective: str, algorithm: str, nbytes: float, p: int) -> Traffic:
    """Steps and bytes of one call. Exact when p divides nbytes evenly, unless noted."""
    N, L = nbytes, _log2ceil(p)
    p2, rem = _fold(p)
    k2, extra = p2.bit_length() - 1, 1 if rem else 0
    if p == 1:
        return Traffic(0, 0, 0)
    table = {
        ("broadcast", "linear"): (p - 1, (p - 1) * N, 0),
        ("broadcast", "tree"): (L, L * N, 0),
        ("broadcast", "ring"): (max(1, math.ceil(N / SEGMENT_BYTES)) + p - 2, N, 0),
        ("reduce", "linear"): (p - 1, N, (p - 1) * N),
        ("reduce", "tree"): (L, N, L * N),
        ("all_reduce", "linear"): (2 * (p - 1), (p - 1) * N, (p - 1) * N),
        ("all_reduce", "tree"): (2 * L, L * N, L * N),
        ("all_reduce", "ring"): (2 * (p - 1), 2 * (p - 1) / p * N, (p - 1) / p * N),
        ("all_reduce", "recursive_doubling"): (k2 + 2 * extra, (k2 + extra) * N, (k2 + extra) * N),
        ("all_reduce", "rabenseifner"): (
            2 * k2 + 2 * extra,
            2 * (p2 - 1) / p2 * N + extra * N,
            (p2 - 1) / p2 * N + extra * N,
        ),
        ("all_reduce", "double_tree"): (2 * (p.bit_length() - 1), 2 * N, N),
        ("all_gather", "linear"): (2 * (p - 1), (p - 1) * N, 0),
        ("all_gather", "ring"): (p - 1, (p - 1) / p * N, 0),
        ("all_gather", "recursive_doubling"): (k2 + 2 * extra, (p - 1) / p * N + extra * N, 0),
        ("all_gather", "bruck"): (L, (p - 1) / p * N, 0),
        ("reduce_scatter", "linear"): (2 * (p - 1), N, (p - 1) * N),
        ("reduce_scatter", "ring"): (p - 1, (p - 1) / p * N, (p - 1) / p * N),
        ("reduce_scatter", "recursive_halving"): (
            k2 + 2 * extra,
            extra * N + (p - 1) / p * N,
            (p - 1) / p * N + extra * N,
        ),
        ("scatter", "linear"): (p - 1, (p - 1) / p * N, 0),
        ("scatter", "tree"): (L, (p - 1) / p * N, 0),
        ("gather", "linear"): (p - 1, N / p, 0),
        ("gather", "tree"): (L, min(1 << (L - 1), p - (1 << (L - 1))) * N / p, 0),
        ("all_to_all", "linear"): (p - 1, (p - 1) / p * N, 0),
        ("all_to_all", "pairwise"): (p - 1, (p - 1) / p * N, 0),
        ("barrier", "dissemination"): (L, 0, 0),
    }
    try:
        steps, sent, reduced = table[(collective, algorithm)]
    except KeyError:
        raise ValueError(f"no cost formula for {collective} with algorithm {algorithm!r}") from None
    inexact = algorithm == "double_tree" or (
        rem and algorithm in ("recursive_doubling", "recursive_halving")
    )
    return Traffic(steps, sent, reduced, exact=not inexact)


def predict(collective: str, algorithm: str, nbytes: float, world_size: int, link=None) -> float:
    """Seconds for one call: steps * alpha + bytes_sent * beta + bytes_reduced * gamma."""
    link = link or default_link()
    t = traffic(collective, algorithm, nbytes, world_size)
    return t.steps * link.alpha + t.bytes_sent * link.beta + t.bytes_reduced * link.gamma


def choose(collective: str, candidates, nbytes: float, world_size: int, link=None) -> str:
    """The candidate algorithm with the lowest predicted time (ties: the first listed)."""
    return min(candidates, key=lambda a: predict(collective, a, nbytes, world_size, link))
