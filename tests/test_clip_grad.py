"""minipar.parallel.clip_grad_norm_ on real meshes (tests/ranks/clip_mesh.py, one launch of 4
ranks): the dense model's norm and clip on layouts with every kind of copy, the same bits on
every rank, other norm types and non-finite norms as torch; planted mistakes caught."""

import pytest
from conftest import ranks_suite

from minipar.testing import harness

SUITE = ranks_suite("clip_mesh.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [4]))
def test_clip_on_mesh(size, name):
    harness.run_suite(SUITE, size, "mpi", timeout=300).check(name)
