"""CUDA tensors through the MPI transport (direct or staged) and the torch transport, for every
collective and algorithm; DDP, FSDP, TP and PP steps on the GPU against the single-device model.
Marked `gpu`: skipped, with the reason, where there is no CUDA device (tests/conftest.py);
scripts/gpu_check.sh runs them on one."""

import os

import pytest
from conftest import ranks_suite

from minipar.testing import harness

pytestmark = pytest.mark.gpu

SUITE = ranks_suite("cuda.py")
STRATEGIES = ranks_suite("cuda_strategies.py")
SIZES = [int(s) for s in os.environ.get("MINIPAR_CUDA_SIZES", "2,4").split(",")]


@pytest.mark.parametrize("size,name", harness.params(SUITE, SIZES))
def test_cuda_over_mpi(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(SUITE, [2]))
def test_cuda_over_torch_transport(size, name):
    harness.run_suite(SUITE, size, "torch").check(name)


@pytest.mark.parametrize("size,name", harness.params(STRATEGIES, SIZES))
def test_strategies_on_cuda(size, name):
    harness.run_suite(STRATEGIES, size, "mpi").check(name)
