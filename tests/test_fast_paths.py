"""The fast paths' switch: the same bits with minipar's shortcuts on and off, each shortcut
really taken when on (tests/ranks/fast_paths.py, one launch per world size), and the switch's
environment variable read as documented."""

import pytest
from conftest import ranks_suite

from minipar.runtime import world
from minipar.testing import harness

SUITE = ranks_suite("fast_paths.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [1, 2, 3, 4]))
def test_fast_paths_change_no_bits(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize(
    "value,expected", [(None, True), ("1", True), ("0", False), ("off", False), ("on", True)]
)
def test_the_environment_sets_the_switch(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(world.FAST_PATHS_ENV, raising=False)
    else:
        monkeypatch.setenv(world.FAST_PATHS_ENV, value)
    assert world._fast_paths(None) is expected
    assert world._fast_paths(not expected) is (not expected)  # the argument wins


def test_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv(world.FAST_PATHS_ENV, "fast")
    with pytest.raises(ValueError, match="MINIPAR_FAST_PATHS must be 0 or 1, got 'fast'"):
        world._fast_paths(None)
