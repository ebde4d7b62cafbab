"""DDP, ZeRO-1 and FSDP (minipar.parallel) on real ranks: against single-process training,
torch's DDP and ZeroRedundancyOptimizer over gloo, the trace ledger, and bad inputs.

- data_parallel.py on MPI, 1, 2, 3 and 4 ranks (5 and 6 too with MINIPAR_EXTENDED=1);
- data_parallel_torch.py: a few of the same cases over the torch.distributed transport.
MINIPAR_EXTENDED=1 widens the world sizes (the torch transport's to 2 and 3).
"""

import os

import pytest
from conftest import ranks_suite

from minipar.testing import harness

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
SUITE = ranks_suite("data_parallel.py")
OVER_TORCH = ranks_suite("data_parallel_torch.py")
SIZES = range(1, 7) if EXTENDED else [1, 2, 3, 4]


@pytest.mark.parametrize("size,name", harness.params(SUITE, SIZES))
def test_data_parallel_mpi(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(OVER_TORCH, [2, 3] if EXTENDED else [2]))
def test_data_parallel_torch_transport(size, name):
    harness.run_suite(OVER_TORCH, size, "torch").check(name)
