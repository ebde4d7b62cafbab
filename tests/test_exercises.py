"""The exercises' tests: they grade solutions/ (default) or exercises/ (`pytest --impl=exercises`,
or `minipar grade`). Test names carry the exercise's file name (ex03_ring_allreduce, ...), which
is how `minipar grade 03` picks a lesson's tests."""

import math

import numpy as np
import pytest
from conftest import ranks_suite

from minipar import cost, exercises
from minipar.testing import harness

SUITE = ranks_suite("exercises.py")
SIZES = [1, 2, 3, 4]


@pytest.mark.parametrize("size,name", harness.params(SUITE, SIZES))
def test_ranks(size, name, exercise_impl):
    harness.run_suite(SUITE, size, "mpi").check(name)


# -- ex04: the alpha-beta fit (one process) --------------------------------------------------------


def ex04(impl: str):
    return exercises.load("ex04_alpha_beta_fit", impl)


def test_ex04_alpha_beta_fit_exact(exercise_impl):
    sizes = np.array([8, 1 << 10, 1 << 16, 1 << 20, 1 << 24], dtype=float)
    alpha, beta = ex04(exercise_impl).fit_alpha_beta(sizes, 5e-6 + sizes / 2e9)
    assert alpha == pytest.approx(5e-6, rel=1e-6), f"alpha {alpha}, want 5e-6"
    assert beta == pytest.approx(1 / 2e9, rel=1e-6), f"beta {beta}, want {1 / 2e9}"


def test_ex04_alpha_beta_fit_noisy_lists(exercise_impl):
    rng = np.random.default_rng(0)
    sizes = [float(1 << k) for k in range(3, 25)] * 3
    times = [(20e-6 + n / 5e9) * (1 + 0.02 * rng.standard_normal()) for n in sizes]
    alpha, beta = ex04(exercise_impl).fit_alpha_beta(sizes, times)  # plain lists work too
    want = np.linalg.lstsq(np.column_stack([np.ones(len(sizes)), sizes]), times, rcond=None)[0]
    assert (alpha, beta) == pytest.approx(tuple(want), rel=1e-9), "not the least-squares fit"
    assert beta == pytest.approx(1 / 5e9, rel=0.05)


@pytest.mark.parametrize("p", [1, 2, 3, 8])
def test_ex04_alpha_beta_fit_ring_time(exercise_impl, p):
    link = cost.Link("test", alpha=7e-6, beta=1 / 3e9, gamma=0.0)
    for nbytes in (8, 1 << 20, 1 << 30):
        got = ex04(exercise_impl).ring_all_reduce_time(link.alpha, link.beta, nbytes, p)
        want = cost.predict("all_reduce", "ring", nbytes, p, link)
        assert got == pytest.approx(want, rel=1e-12), f"p={p} n={nbytes}: {got}, want {want}"


@pytest.mark.parametrize("p", [2, 4, 8, 64])
def test_ex04_alpha_beta_fit_crossover(exercise_impl, p):
    link = cost.Link("test", alpha=20e-6, beta=1 / 5e9, gamma=0.0)
    got = ex04(exercise_impl).ring_beats_recursive_doubling(link.alpha, link.beta, p)
    want = cost.crossover("all_reduce", "recursive_doubling", "ring", p, link)
    if want is None:
        assert got == math.inf, f"p={p}: the ring never wins, expected math.inf, got {got}"
    else:
        assert got == pytest.approx(want, rel=2e-3), f"p={p}: {got}, cost.crossover says {want}"


# -- ex07: the 1F1B schedule (one process, minipar's verifier) ----------------------------------


def ex07(impl: str):
    return exercises.load("ex07_one_f_one_b", impl)


def test_ex07_one_f_one_b_verifies(exercise_impl):
    from minipar.parallel.pipeline import schedules as S
    from minipar.parallel.pipeline import verify as V

    for p in range(2, 9):
        for m in range(1, 17):
            compute = [ex07(exercise_impl).one_f_one_b(r, p, m) for r in range(p)]
            program = [S.with_comms(c, r, p, 1) for r, c in enumerate(compute)]
            report = V.verify(program)  # raises on a deadlock or a lost micro-batch
            want = [min(p - r, m) for r in range(p)]
            assert report.peak_in_flight == want, f"p={p} m={m}: peak {report.peak_in_flight}"
            assert report.bubble_fraction == pytest.approx((p - 1) / (m + p - 1)), (p, m)


def test_ex07_one_f_one_b_is_minipars(exercise_impl):
    from minipar.parallel.pipeline import schedules as S

    for p, m in ((4, 8), (4, 2), (3, 5)):
        for r in range(p):
            mine = S.with_comms(ex07(exercise_impl).one_f_one_b(r, p, m), r, p, 1)
            assert mine == S.instructions("1f1b", r, p, m), f"rank {r} of p={p}, m={m}"
