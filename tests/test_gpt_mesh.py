"""The tiny GPT on real meshes (tests/ranks/gpt_mesh.py): every layout of 8 ranks (and of 4)
with dp, tp, pp in {1, 2, 4, 8} trains 2 steps with the dense run's losses, its first step's
gradients the dense model's on the whole batch (micro-batches accumulated, pp = 1 too); tied heads,
checkpoints moved between layouts, wrong layouts refused on every rank; recomputation bitwise,
activation memory against the formula and a trace of every rank (tests/ranks/gpt_recompute.py).
One launch of 8 ranks (the 4-rank layouts run on its two halves at once)."""

import pytest
from conftest import ranks_suite

from minipar.testing import harness

SUITE = ranks_suite("gpt_mesh.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [8]))
def test_gpt_on_mesh(size, name):
    # 17 trainings (2 steps) and 8 recomputation cases (1 step) on 8 ranks: ~60 s on a quiet
    # 2-core machine, several times that under load, beyond the harness's default deadline
    harness.run_suite(SUITE, size, "mpi", timeout=840).check(name)
