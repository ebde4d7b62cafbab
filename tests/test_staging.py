"""The staged path's chunking under real MPI on CPU ranks, and each rank's device (CPU here)."""

import pytest
from conftest import ranks_suite

from minipar.testing import harness

SUITE = ranks_suite("staging.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [3]))
def test_staging_on_cpu_ranks(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)
