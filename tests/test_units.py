"""Single-process checks of the pieces the algorithms are built from (no MPI launch)."""

import numpy as np
import pytest
import torch

from minipar import cost
from minipar.collectives import double_tree, layout, registry, ring
from minipar.collectives import reduce_op as ops


@pytest.mark.parametrize("n,p", [(10, 4), (0, 3), (7, 7), (5, 8), (1031, 6)])
def test_bounds_cover_and_balance(n, p):
    edges = layout.bounds(n, p)
    sizes = np.diff(edges)
    assert edges[0] == 0 and edges[-1] == n and len(sizes) == p
    assert sizes.max() - sizes.min() <= 1 and list(sizes) == sorted(sizes, reverse=True)


@pytest.mark.parametrize("p", range(1, 17))
def test_fold_renumbers_every_rank_once(p):
    p2, rem = layout.fold(p)
    assert p2 & (p2 - 1) == 0 and p2 <= p < 2 * p2 and rem == p - p2
    members = [layout.folded_rank(r, rem) for r in range(p)]
    assert sorted(m for m in members if m is not None) == list(range(p2))
    covered = [r for j in range(p2) for r in range(*layout.covered(j, rem))]
    assert covered == list(range(p)), "participants must stand for every rank, in order"
    assert all(layout.folded_rank(layout.unfolded_rank(j, rem), rem) == j for j in range(p2))


@pytest.mark.parametrize("p", range(1, 17))
def test_double_tree_shapes(p):
    for parent, children in double_tree.trees(p):
        roots = [r for r in range(p) if parent[r] is None]
        assert len(roots) == 1, roots
        assert all(len(c) <= 2 for c in children.values())
        for r in range(p):  # every rank reaches the root
            seen, node = 0, r
            while parent[node] is not None and seen <= p:
                node, seen = parent[node], seen + 1
            assert node == roots[0]
    if p >= 2 and p % 2 == 0:  # complementary: no rank is interior in both trees
        (_, a), (_, b) = double_tree.trees(p)
        assert not [r for r in range(p) if a[r] and b[r]]


def test_segment_size_shared_with_cost_model():
    assert cost.SEGMENT_BYTES == ring.SEGMENT_BYTES


def test_every_algorithm_has_a_cost_formula():
    for collective, table in registry.ALGORITHMS.items():
        for algorithm in table:
            t = cost.traffic(collective, algorithm, 1 << 20, 8)
            assert t.steps >= 1 and t.bytes_sent >= 0


def test_algorithms_lists_auto_first_and_aliases():
    assert registry.algorithms("all_reduce")[0] == "auto"
    assert registry.algorithms("all_gather_into_tensor") == registry.algorithms("all_gather")
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        registry.algorithms("allreduce")


def test_auto_is_latency_optimal_small_and_bandwidth_optimal_large():
    small = cost.choose("all_reduce", ["ring", "recursive_doubling"], 8, 8)
    large = cost.choose("all_reduce", ["ring", "recursive_doubling"], 1 << 28, 8)
    assert (small, large) == ("recursive_doubling", "ring")


@pytest.mark.parametrize("make", [np.array, torch.tensor])
def test_reduce_reverse_orders_operands(make):
    """min(-0.0, +0.0) depends on operand order; reverse=True computes src op dst."""
    a, b = make([-0.0]), make([0.0])
    x = make([-0.0])
    ops.reduce_(x, b, ops.ReduceOp.MIN)
    y = make([0.0])
    ops.reduce_(y, a, ops.ReduceOp.MIN, reverse=True)
    assert np.signbit(np.asarray(x)[0]) == np.signbit(np.asarray(y)[0])


def test_ops_by_name_and_errors():
    assert ops.as_op("sum") is ops.ReduceOp.SUM
    with pytest.raises(ValueError, match="unknown reduction op 'median'"):
        ops.as_op("median")
    with pytest.raises(ValueError, match="AVG needs a floating-point dtype, got int32"):
        ops.check_op(ops.ReduceOp.AVG, np.zeros(2, np.int32))
