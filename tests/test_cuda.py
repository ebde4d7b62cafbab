"""CUDA tensors through the MPI transport (direct or staged) and the torch transport, for every
collective and algorithm. Skipped without a GPU; scripts/gpu_check.sh runs it on one."""

import os

import pytest
from conftest import ranks_suite

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from minipar.testing import harness  # noqa: E402

SUITE = ranks_suite("cuda.py")
SIZES = [int(s) for s in os.environ.get("MINIPAR_CUDA_SIZES", "2,4").split(",")]


@pytest.mark.parametrize("size,name", harness.params(SUITE, SIZES))
def test_cuda_over_mpi(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(SUITE, [2]))
def test_cuda_over_torch_transport(size, name):
    harness.run_suite(SUITE, size, "torch").check(name)
