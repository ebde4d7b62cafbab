"""Tensor parallelism (minipar.parallel.tensor) on real ranks: every layer against its dense
twin at TP = 1, 2, 3, 4 on MPI, a spread of cases over the torch.distributed transport, and
torch.distributed.tensor.parallel on the same weights at TP = 2 and 4 (see tests/ranks/
tensor_parallel.py for the cases and the tolerance). One launch per world size and transport.
"""

import os

import pytest
from conftest import ranks_suite

from minipar.testing import harness

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
SUITE = ranks_suite("tensor_parallel.py")
OVER_TORCH = ranks_suite("tensor_parallel_torch.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [1, 2, 3, 4]))
def test_tensor_parallel_mpi(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(OVER_TORCH, [2, 3, 4] if EXTENDED else [2]))
def test_tensor_parallel_torch_transport(size, name):
    harness.run_suite(OVER_TORCH, size, "torch").check(name)
