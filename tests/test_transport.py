"""Point-to-point transport on real ranks: MPI under mpiexec and torch.distributed (gloo) under
torch.multiprocessing.spawn run the same cases. MINIPAR_EXTENDED=1 adds world sizes 5-8 on MPI
and 4 on torch (the default keeps the suite inside its time)."""

import os

import pytest
from conftest import ranks_suite

from minipar.testing import harness

SUITE = ranks_suite("transport.py")
EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"


@pytest.mark.parametrize(
    "size,name", harness.params(SUITE, range(1, 9) if EXTENDED else [1, 2, 3, 4])
)
def test_mpi(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(SUITE, [2, 4] if EXTENDED else [2]))
def test_torch_spawn(size, name):
    harness.run_suite(SUITE, size, "torch").check(name)
