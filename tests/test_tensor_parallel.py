"""Tensor parallelism (minipar.parallel.tensor) on real ranks: every layer against its dense
twin at TP = 1, 2, 3, 4 on MPI, a spread of cases over the torch.distributed transport (2
ranks; 3 and 4 too with MINIPAR_EXTENDED=1), and torch.distributed.tensor.parallel on the same
weights (see tests/ranks/tensor_parallel.py for the cases and the tolerance).
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


def test_bench_tp_summary():
    """`minipar bench tp`'s table from per-iteration times (the job itself is not a test)."""
    from minipar.bench import tp

    times = {
        "mlp/minipar": [0.3, 0.1, 0.2],
        "mlp/torch": [0.4, 0.2, 0.6],
        "attention/minipar": [0.2, 0.2, 0.2],
        "attention/torch": [0.1, 0.1, 0.1],
        "comm/minipar": [0.05, 0.05],
        "comm/torch": [0.02, 0.02],
    }
    rows = {(r["block"], r["implementation"]): r for r in tp.summary(times)}
    mlp = rows["mlp", "minipar"]
    assert (mlp["min_ms"], mlp["median_ms"], mlp["max_ms"]) == pytest.approx((100, 200, 300))
    assert mlp["x_torch"] == pytest.approx(0.5) and mlp["comm_share"] == pytest.approx(0.25)
    assert rows["attention", "minipar"]["x_torch"] == pytest.approx(2.0)
    assert rows["attention", "torch"]["comm_share"] == pytest.approx(0.2)
