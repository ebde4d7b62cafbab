"""Vocabulary padding for tensor parallelism (issue 28): a vocabulary the TP degree does not
divide (67, 251, 257, GPT-2's 50,257) padded Megatron's way, on real ranks at TP = 1, 2, 4
(tests/ranks/vocab_padding.py has the cases). One launch per world size."""

import pytest
from conftest import ranks_suite

from minipar.testing import harness

SUITE = ranks_suite("vocab_padding.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [1, 2, 4]))
def test_vocab_padding(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


def test_padded_sizes():
    """The arithmetic alone: the smallest multiple of multiple x p that holds the vocabulary
    (Megatron's GPT-2 numbers for 128), nothing added where it divides."""
    from minipar.parallel.tensor import padded_vocab

    assert [padded_vocab(50257, p, 128) for p in (1, 2, 4, 8)] == [50304, 50432, 50688, 51200]
    assert [padded_vocab(50257, p) for p in (1, 2, 4, 8)] == [50257, 50258, 50260, 50264]
    assert [padded_vocab(256, p) for p in (1, 2, 4, 8)] == [256] * 4
    assert padded_vocab(67, 3) == 69 and padded_vocab(67, 4, 8) == 96
