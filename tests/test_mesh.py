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


def test_cp_sits_between_tp_and_dp_as_megatron_lays_it():
    """tp-cp-dp-pp: rank = ((pp * dp + dp_rank) * cp + cp_rank) * tp + tp_rank."""
    s = MeshShape(dp=2, tp=2, pp=2, cp=2)
    assert s.size == 16
    for r in range(16):
        where = s.position(r)
        assert r == ((where["pp"] * 2 + where["dp"]) * 2 + where["cp"]) * 2 + where["tp"]
        assert s.rank_of(where["pp"], where["dp"], where["tp"], where["cp"]) == r
        assert s.coords(r) == (where["pp"], where["dp"], where["tp"])
    assert s.groups("tp")[:2] == [[0, 1], [2, 3]]
    assert s.groups("cp")[:3] == [[0, 2], [1, 3], [4, 6]]  # tp apart
    assert s.groups("dp")[:3] == [[0, 4], [1, 5], [2, 6]]  # cp x tp apart
    assert s.groups("pp")[0] == [0, 8]
    assert s.dp_cp_groups() == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    for kind in ("tp", "cp", "dp", "pp", "dp_cp", "ep", "expert_dp"):  # each a partition
        assert sorted(r for g in s.all_groups(kind) for r in g) == list(range(16)), kind
    assert str(s) == "dp=2 x cp=2 x tp=2 x pp=2"
    # cp = 1 keeps the old numbering, groups and words
    assert MeshShape(2, 2, 2).groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert str(MeshShape(2, 2, 2)) == "dp=2 x tp=2 x pp=2"


def test_ep_is_laid_over_dp():
    """dp = 4, ep = 2: tokens travel in [0 1] and [2 3]; [0 2] and [1 3] hold the same experts
    (minipar.parallel.expert.groups' layout, mapped to mesh ranks)."""
    from minipar.parallel.expert import groups

    s = MeshShape(dp=4, ep=2)
    assert s.expert_groups() == groups.expert_parallel_ranks(4, 2) == [[0, 1], [2, 3]]
    assert s.expert_dp_groups() == groups.expert_data_parallel_ranks(4, 2) == [[0, 2], [1, 3]]
    assert [s.position(r)["ep"] for r in range(4)] == [0, 1, 0, 1]
    # with tp = 2 and cp = 2: an ep group keeps its (cp, tp) place; expert dp spans the cp ranks
    s = MeshShape(dp=2, tp=2, cp=2, ep=2)
    assert s.expert_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert s.expert_dp_groups() == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert str(s) == "dp=2 x cp=2 x tp=2 x pp=1, ep=2"
    with pytest.raises(ValueError, match="ep=3 must divide dp=4"):
        MeshShape(dp=4, ep=3)
    with pytest.raises(ValueError, match="cp must be a positive integer, got 0"):
        MeshShape(cp=0)


def test_render_shows_cp_columns_and_ep_rows():
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=160).print(render(MeshShape(dp=4, tp=2, cp=2, ep=2)))
    text = out.getvalue()
    assert "cp 1 tp 0" in text and "ep 1.1" in text and "hold the same experts" in text
    for r in range(16):
        assert f" {r} " in f" {text} ".replace("\n", " ")


def test_hybrid_groups_keep_the_shard_inside_a_node():
    """dp=4 x tp=2 (ranks r = 2 dp + tp), shards of 2 dp ranks: the shard groups are the
    consecutive dp ranks of each tp place, inside a node of 4 ranks; the replicate groups join
    the same place of both nodes."""
    shape = MeshShape(dp=4, tp=2)
    groups = shape.hybrid_groups(2)
    assert groups["dp_shard"] == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert groups["dp_replicate"] == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert shape.hybrid_placement(2, 4) == {"dp_shard": "inside a node",
                                           "dp_replicate": "across nodes"}  # fmt: skip
    assert shape.hybrid_placement(2, 2)["dp_shard"] == "across nodes"  # nodes of 2: tp's pairs
    with pytest.raises(ValueError, match="dp_shard=3 must divide dp=4"):
        shape.hybrid_groups(3)


def test_placement_says_which_axes_cross_nodes():
    """Consecutive ranks fill nodes: on nodes of 4, dp=2 x tp=2 x pp=2 keeps tp and dp inside
    and puts pp across; tp=8 on nodes of 4 crosses; `minipar plan` prints the same words."""
    from minipar.cli.plan import placement
    from minipar.planning.planner import Layout

    shape = MeshShape(dp=2, tp=2, pp=2)
    assert shape.placement(4) == {"tp": "inside a node", "dp": "inside a node",
                                  "pp": "across nodes"}  # fmt: skip
    assert MeshShape(tp=8).placement(4) == {"tp": "across nodes"}
    assert MeshShape(dp=4, ep=2).placement([0, 0, 1, 1]) == {"dp": "across nodes",
                                                              "ep": "inside a node"}  # fmt: skip
    words = placement(Layout(dp=2, tp=2, pp=2, micro_batch=1, microbatches=1), 4)
    assert "tp inside a node" in words and "pp across nodes" in words
