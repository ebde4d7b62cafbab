"""Exercise 04, fitting the alpha-beta model (lesson 04: topology and bandwidth).

A message of n bytes takes about  t(n) = alpha + n * beta : alpha is the latency (seconds per
message), beta the inverse bandwidth (seconds per byte). Given measured (n, t) pairs, find the
alpha and beta that fit best in the least-squares sense (numpy.linalg.lstsq). Then use them:
predict a ring all-reduce, and find the size where the ring starts to beat recursive doubling.

    ring all-reduce            2 (p-1) alpha  +  2 (p-1)/p n beta
    recursive doubling         log2(p) alpha  +  log2(p) n beta          (p a power of two)

Reductions are free here (no gamma term). minipar.cost has the full model; the grader checks
your answers against it: the fit on exact and on noisy points (against numpy's least squares),
the ring's time for p = 1, 2, 3, 8 and 8 B to 1 GiB, and the crossover for p = 2 to 64; a
failure names the call and its arguments, yours beside the expected value.

Grade it: minipar grade 04
"""

import math

import numpy as np


def fit_alpha_beta(nbytes, seconds) -> tuple[float, float]:
    """(alpha, beta) minimising sum((alpha + n beta - t)^2) over the measurements."""
    n, t = np.asarray(nbytes, dtype=float), np.asarray(seconds, dtype=float)
    # BEGIN SOLUTION hint: the matrix has a column of ones (alpha) and a column of n (beta):
    # hint: np.linalg.lstsq(np.column_stack([np.ones_like(n), n]), t, rcond=None)
    a = np.column_stack([np.ones_like(n), n])
    (alpha, beta), *_ = np.linalg.lstsq(a, t, rcond=None)
    return float(alpha), float(beta)
    # END SOLUTION


def ring_all_reduce_time(alpha: float, beta: float, nbytes: float, p: int) -> float:
    """Seconds for a ring all-reduce of nbytes on p ranks (no reduction cost)."""
    # BEGIN SOLUTION hint: 2 (p-1) steps of alpha, and 2 (p-1)/p * nbytes bytes of beta each
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
    # END SOLUTION


def ring_beats_recursive_doubling(alpha: float, beta: float, p: int) -> float:
    """The size in bytes above which the ring all-reduce is faster than recursive doubling on p
    ranks (p a power of two, p >= 2); math.inf if the ring never wins."""
    # BEGIN SOLUTION hint: set the two times equal and solve for n; the ring never wins when its
    # hint: bytes factor 2(p-1)/p is not below log2(p)
    steps = 2 * (p - 1) - math.log2(p)  # extra latency terms the ring pays
    per_byte = math.log2(p) - 2 * (p - 1) / p  # extra bandwidth terms recursive doubling pays
    if per_byte <= 0:
        return math.inf
    return steps * alpha / (per_byte * beta)
    # END SOLUTION
