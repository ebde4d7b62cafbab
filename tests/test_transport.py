"""Point-to-point transport on real ranks: MPI under mpiexec and torch.distributed (gloo) under
torch.multiprocessing.spawn run the same cases."""

import pytest
from conftest import ranks_suite

from minipar.testing import harness

SUITE = ranks_suite("transport.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [1, 2, 3, 4, 5, 6, 7, 8]))
def test_mpi(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(SUITE, [2, 4]))
def test_torch_spawn(size, name):
    harness.run_suite(SUITE, size, "torch").check(name)
