"""minipar.parallel.clip_grad_norm_ on real meshes (tests/ranks/clip_mesh.py, one launch of 4
ranks): the dense model's norm and clip on layouts with every kind of copy, the same bits on
every rank, other norm types and non-finite norms as torch; planted mistakes caught."""

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
