"""The single-copy shared-memory transport on real ranks (tests/ranks/shm.py): 2, 3 (odd) and 4
ranks, every case checked on its own (MINIPAR_EXTENDED=1: every dtype, see the suite)."""

import pytest
from conftest import ranks_suite

from minipar.testing import harness

SUITE = ranks_suite("shm.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [2, 3, 4]))
def test_shm(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


def test_cost_prices_each_transport():
    """The window's link is priced apart from MPI's, and `auto` keeps small messages on MPI."""
    from minipar import cost

    assert not cost.prefers_shm("all_reduce", "ring", 8, 2)
    small, big = (cost.predict_shm("all_reduce", n, 4) for n in (1 << 10, 1 << 26))
    assert 0 < small < big
    t = cost.shm_traffic("all_reduce", 1 << 20, 4)
    assert t.steps == 3 and t.bytes_reduced == 3 / 4 * (1 << 20)
