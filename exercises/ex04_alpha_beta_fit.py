# Generated from solutions/ex04_alpha_beta_fit.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 04`.
# The grader admits these imports here (others it refuses, naming the line):
#   math, numpy
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
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
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")


def ring_all_reduce_time(alpha: float, beta: float, nbytes: float, p: int) -> float:
    """Seconds for a ring all-reduce of nbytes on p ranks (no reduction cost)."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")


def ring_beats_recursive_doubling(alpha: float, beta: float, p: int) -> float:
    """The size in bytes above which the ring all-reduce is faster than recursive doubling on p
    ranks (p a power of two, p >= 2); math.inf if the ring never wins."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
