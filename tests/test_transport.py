"""Point-to-point transport on real ranks: MPI under mpiexec and torch.distributed (gloo) under
torch.multiprocessing.spawn run the same cases, on 1-8 ranks (MPI) and 2 and 4 (torch)."""

import pytest
from conftest import ranks_suite

from minipar.testing import harness

SUITE = ranks_suite("transport.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, range(1, 9)))
def test_mpi(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(SUITE, [2, 4]))
def test_torch_spawn(size, name):
    harness.run_suite(SUITE, size, "torch").check(name)
