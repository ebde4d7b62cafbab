"""minipar.parallel.clip_grad_norm_ on real meshes (tests/ranks/clip_mesh.py, one launch of 4
ranks): the dense model's norm and clip on layouts with every kind of copy, the same bits on
every rank, other norm types and non-finite norms as torch; planted mistakes caught.

Checks: minipar/parallel/clip_grad.py, replicas.py (and the layers' marks they read)."""

import math

import pytest
import torch
from conftest import ranks_suite

from minipar.parallel import clip_grad_norm_
from minipar.testing import harness

SUITE = ranks_suite("clip_mesh.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [4]))
def test_clip_on_mesh(size, name):
    harness.run_suite(SUITE, size, "mpi", timeout=300).check(name)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 3])
def test_one_process_is_torchs_clip(norm_type):
    """Before minipar.init(), on one process: torch's norm and clipped gradients."""
    grads = []
    for clip in (torch.nn.utils.clip_grad_norm_, clip_grad_norm_):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        net(torch.randn(5, 8)).square().sum().backward()
        norm = clip(net.parameters(), 0.1, norm_type)
        grads.append((norm, [q.grad for q in net.parameters()]))
    (want, ref), (got, mine) = grads
    assert got.dtype == want.dtype and abs(got.item() - want.item()) <= 1e-6 * want.item()
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="norm_type must be > 0"):
        clip_grad_norm_(net.parameters(), 0.1, 0)


# -- branches and constants a dense layout does not reach (issue 72's planted bugs) -------------


def test_an_infinite_norm_raises_as_a_nan_does_and_scales_as_torchs():
    """An inf gradient (not a NaN): error_if_nonfinite raises, as torch's; without it the
    gradients are scaled by max_norm / inf = 0 (inf x 0: NaN), the same as torch's."""
    for bad in (math.inf, math.nan):
        results = []
        for clip in (torch.nn.utils.clip_grad_norm_, clip_grad_norm_):
            q = torch.nn.Parameter(torch.ones(3))
            q.grad = torch.tensor([1.0, bad, 2.0])
            with pytest.raises(RuntimeError, match="non-finite"):
                clip([q], 1.0, error_if_nonfinite=True)
            norm = clip([q], 1.0)
            results.append((norm, q.grad.clone()))
        (want, ref), (got, mine) = results
        assert math.isinf(got.item()) == math.isinf(bad) and got.isnan() == want.isnan()
        torch.testing.assert_close(mine, ref, equal_nan=True)


def test_the_clip_factor_is_max_norm_over_norm_plus_1e_6():
    """torch's factor max_norm / (norm + 1e-6), in float64 where 1e-6 on a norm of 5 shows:
    gradient (3, 4), norm 5, max_norm 1."""
    q = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    q.grad = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert clip_grad_norm_([q], 1.0).item() == 5.0
    want = torch.tensor([3.0, 4.0], dtype=torch.float64) / (5.0 + 1e-6)
    torch.testing.assert_close(q.grad, want, rtol=1e-13, atol=0)


@pytest.mark.parametrize("norm_type,identity", [(2.0, 0.0), (math.inf, 0.0), (-math.inf, math.inf)])
def test_a_rank_that_counts_nothing_adds_the_reductions_identity(norm_type, identity):
    """A rank whose numbers all count elsewhere (a tp copy's rank 1) still joins the
    all-reduce: with the op's identity (SUM's 0, MAX's 0 for |g|, MIN's +inf), so the mesh's
    -inf norm is the smallest |g| of the others, not 0."""
    from minipar.parallel.clip_grad import _local

    assert _local([], norm_type, None).tolist() == [identity]
