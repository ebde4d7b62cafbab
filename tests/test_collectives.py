"""Every collective x algorithm on real ranks.

- collectives.py on MPI, 1-8 ranks: against numpy, identical on every rank, the trace ledger
  against minipar.cost's formulas, sub-groups, collectives in flight, async progress, memory
  (every dtype on 1, 2 and 4 ranks, a spread of them on 3 and above 4);
- collectives_refs.py: against MPI's own collectives and torch.distributed (gloo) in the same job;
- collectives_torch.py: the same matrix over minipar's torch.distributed transport (spawn + gloo).
MINIPAR_EXTENDED=1 widens the references' world sizes (2-8), the torch transport's (1-8) and
the dtypes above 4 ranks.
"""

import os

import pytest
from conftest import ranks_suite

from minipar.testing import harness

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
MATRIX = ranks_suite("collectives.py")
REFS = ranks_suite("collectives_refs.py")
OVER_TORCH = ranks_suite("collectives_torch.py")


@pytest.mark.parametrize("size,name", harness.params(MATRIX, range(1, 9)))
def test_matrix_mpi(size, name):
    harness.run_suite(MATRIX, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(REFS, range(2, 9) if EXTENDED else [4]))
def test_against_mpi_and_torch(size, name):
    harness.run_suite(REFS, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(OVER_TORCH, range(1, 9) if EXTENDED else [2]))
def test_matrix_torch_transport(size, name):
    harness.run_suite(OVER_TORCH, size, "torch").check(name)
