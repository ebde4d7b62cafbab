"""Buffers in the node's shared window (minipar.empty; DDP's buckets, FSDP's slots) and the
collectives that read them in place, on real ranks (tests/ranks/window_buffers.py): one launch
per world size, 1 to 4 (on one rank the buffer is private)."""

import pytest
from conftest import ranks_suite

from minipar.testing import harness

SUITE = ranks_suite("window_buffers.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [1, 2, 3, 4]))
def test_window_buffers(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)
