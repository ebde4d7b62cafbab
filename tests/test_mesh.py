"""DeviceMesh: the grid arithmetic on one process, and real meshes on 4 and 8 MPI ranks
(tests/ranks/mesh.py): every layout's groups checked with an all-reduce on each."""

import io

import pytest
from conftest import ranks_suite

from minipar.parallel.mesh import MeshShape, render
from minipar.testing import harness

SUITE = ranks_suite("mesh.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [4, 8]))
def test_mesh_on_ranks(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


def test_shape_numbering_and_groups():
    s = MeshShape(dp=2, tp=2, pp=2)
    assert [s.coords(r) for r in range(8)] == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (0, 1, 1),
        (1, 0, 0),
        (1, 0, 1),
        (1, 1, 0),
        (1, 1, 1),
    ]
    assert all(s.rank_of(*s.coords(r)) == r for r in range(8))
    assert s.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]  # adjacent: one NVLink domain
    assert s.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert s.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for axis in ("tp", "dp", "pp"):  # each axis's groups partition the ranks
        assert sorted(r for g in s.groups(axis) for r in g) == list(range(8))
    assert s.group_of("dp", 5) == [5, 7]


def test_shape_errors():
    with pytest.raises(ValueError, match="tp must be a positive integer, got 0"):
        MeshShape(tp=0)
    with pytest.raises(ValueError, match="rank 8 is outside the mesh of 8 ranks"):
        MeshShape(2, 2, 2).coords(8)
    with pytest.raises(ValueError, match="axis must be one of"):
        MeshShape().groups("ep")


def test_render_shows_every_rank_and_node():
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=120).print(render(MeshShape(dp=2, tp=4, pp=2), 5, per_node=8))
    text = out.getvalue()
    assert "stage 0" in text and "stage 1" in text and "tp 3" in text
    for r in range(16):
        assert f"{r} n{r // 8}" in text
