"""DeviceMesh cases (run on every rank by minipar.testing): every (dp, tp, pp) layout of the
world, its groups checked by a collective on each, wrong layouts, a mesh on a sub-group.
No torch here (numpy only), so a launch costs no torch import."""

import functools

import numpy as np
import pytest

import minipar
from minipar.parallel.mesh import DeviceMesh


def layouts(size):
    """Every (dp, tp, pp) whose product is size."""
    return [
        (dp, tp, size // (dp * tp))
        for dp in range(1, size + 1)
        for tp in range(1, size + 1)
        if size % (dp * tp) == 0
    ]


def expected_coords(rank, dp, tp, pp):
    """The grid written out independently of MeshShape: tp fastest, then dp, then pp."""
    return rank // (dp * tp), (rank // tp) % dp, rank % tp


def check_mesh(mesh, world_of):
    """Coordinates, group membership and a sum over each group against the written-out grid."""
    dp, tp, pp = mesh.dp, mesh.tp, mesh.pp
    me = mesh.rank
    p, d, t = expected_coords(me, dp, tp, pp)
    assert mesh.coords == (p, d, t), (mesh.coords, (p, d, t))
    same = {
        "tp": [r for r in range(mesh.size) if expected_coords(r, dp, tp, pp)[:2] == (p, d)],
        "dp": [r for r in range(mesh.size) if expected_coords(r, dp, tp, pp)[::2] == (p, t)],
        "pp": [r for r in range(mesh.size) if expected_coords(r, dp, tp, pp)[1:] == (d, t)],
    }
    for axis, group in (("tp", mesh.tp_group), ("dp", mesh.dp_group), ("pp", mesh.pp_group)):
        members = [world_of[r] for r in same[axis]]
        assert group.size == len(members), (axis, group.size, members)
        assert group.global_ranks == members, (axis, group.global_ranks, members)
        assert mesh.global_ranks(axis) == members
        # the group's own rank is the coordinate along its axis
        assert group.rank == {"tp": t, "dp": d, "pp": p}[axis], (axis, group.rank)
        x = np.full(4, float(world_of[me]) + 1)
        minipar.all_reduce(x, group=group)
        assert (x == sum(members) + len(members)).all(), (axis, x, members)
    assert mesh.is_first_stage == (p == 0) and mesh.is_last_stage == (p == pp - 1)
    assert mesh.prev_stage == (p - 1 if p > 0 else None)
    assert mesh.next_stage == (p + 1 if p < pp - 1 else None)


def every_layout():
    w = minipar.init()
    for dp, tp, pp in layouts(w.size):
        mesh = DeviceMesh(dp=dp, tp=tp, pp=pp)
        check_mesh(mesh, list(range(w.size)))
        assert repr(mesh).startswith(f"DeviceMesh(dp={dp}, tp={tp}, pp={pp}; rank {w.rank}")


def pipeline_neighbours_talk():
    """A ring shift along pp_group by its prev/next stages: each stage receives its left one."""
    w = minipar.init()
    if w.size % 2:
        return
    mesh = DeviceMesh(dp=1, tp=w.size // 2, pp=2) if w.size >= 2 else None
    g = mesh.pp_group
    out = np.full(3, float(w.rank))
    if mesh.next_stage is not None:
        g.send(out, mesh.next_stage)
    if mesh.prev_stage is not None:
        got = np.zeros(3)
        g.recv(got, mesh.prev_stage)
        assert (got == w.rank - mesh.tp).all(), got


def product_mismatch():
    w = minipar.init()
    bad = (2, 3, 1) if w.size != 6 else (2, 2, 2)
    dp, tp, pp = bad
    msg = rf"dp={dp} x tp={tp} x pp={pp} = {dp * tp * pp} ranks, but the group has {w.size}"
    with pytest.raises(ValueError, match=msg):
        DeviceMesh(dp=dp, tp=tp, pp=pp)
    # nothing moved: the world is still in step for the next collective
    x = np.ones(2)
    minipar.all_reduce(x)
    assert (x == w.size).all()


def bad_degrees():
    minipar.init()
    for kwargs, shown in (
        ({"dp": 0}, "dp must be a positive integer, got 0"),
        ({"tp": -2}, "tp must be a positive integer, got -2"),
        ({"pp": 2.0}, "pp must be a positive integer, got 2.0"),
        ({"dp": True}, "dp must be a positive integer, got True"),
    ):
        with pytest.raises(ValueError, match=shown):
            DeviceMesh(**kwargs)


def on_sub_group():
    """Two meshes side by side, one on each half of the world: world ranks offset by the half."""
    w = minipar.init()
    if w.size < 4 or w.size % 2:
        return
    half = w.size // 2
    lower, upper = minipar.new_group(range(half)), minipar.new_group(range(half, w.size))
    mine = lower if w.rank < half else upper
    offset = 0 if w.rank < half else half
    mesh = DeviceMesh(dp=half // 2, tp=2, pp=1, group=mine)
    check_mesh(mesh, [offset + r for r in range(half)])


def grid_place(r, dp, cp, tp):
    """(pp, dp, cp, tp) of rank r, tp fastest, written out apart from MeshShape."""
    return r // (dp * cp * tp), r // (cp * tp) % dp, r // tp % cp, r % tp


def cp_and_ep_layouts():
    """Meshes with a cp axis and ep groups: every group's members against the grid written out
    (rank = ((pp * dp + d) * cp + c) * tp + t; ep groups: ep consecutive dp ranks of one place;
    expert dp: the same position in every ep group, over every cp rank), and a sum over each."""
    w = minipar.init()
    layouts = {4: [(2, 1, 1, 2, 1), (4, 1, 1, 1, 2), (2, 1, 1, 2, 2)],
               8: [(2, 2, 1, 2, 1), (4, 1, 1, 2, 2), (2, 1, 2, 2, 2), (8, 1, 1, 1, 4)]}  # fmt: skip
    for dp, tp, pp, cp, ep in layouts.get(w.size, []):
        mesh = DeviceMesh(dp, tp, pp, cp=cp, ep=ep)

        at = functools.partial(grid_place, dp=dp, cp=cp, tp=tp)
        p, d, c, t = at(w.rank)
        assert (mesh.pp_rank, mesh.dp_rank, mesh.cp_rank, mesh.tp_rank) == (p, d, c, t)
        assert mesh.ep_rank == d % ep
        everyone = range(w.size)
        same = {
            "cp": [r for r in everyone if at(r)[:2] == (p, d) and at(r)[3] == t],
            "dp_cp": [r for r in everyone if (at(r)[0], at(r)[3]) == (p, t)],
            "ep": [r for r in everyone if at(r)[::2] == (p, c) and at(r)[3] == t
                   and at(r)[1] // ep == d // ep],
            "expert_dp": [r for r in everyone if (at(r)[0], at(r)[3]) == (p, t)
                          and at(r)[1] % ep == d % ep],
        }  # fmt: skip
        for kind, members in same.items():
            group = getattr(mesh, f"{kind}_group")
            assert sorted(group.global_ranks) == members, (kind, group.global_ranks, members)
            assert sorted(mesh.global_ranks(kind)) == members
            x = np.full(2, float(w.rank) + 1)
            minipar.all_reduce(x, group=group)
            assert (x == sum(members) + len(members)).all(), (kind, x, members)
    # ep must divide dp: refused on every rank before any group is built
    with pytest.raises(ValueError, match="must divide dp"):
        DeviceMesh(w.size, 1, 1, ep=3 if w.size % 3 else 5)


def placed_by_node():
    """On 2 nodes of 2 (a node map set as data): dp=2 x tp=2 keeps tp inside the nodes and dp
    across; tp=4, or nodes that do not hold consecutive ranks, put tp across: a warning, or
    with across_nodes="refuse" the same ValueError on every rank, before any group is made."""
    import warnings

    from minipar.parallel import mesh as mesh_module
    from minipar.runtime import nodes
    from minipar.state import process

    saved = process.nodes
    try:
        for owner, tp, want in (
            ([0, 0, 1, 1], 2, {"tp": "inside a node", "dp": "across nodes"}),
            ([0, 1, 0, 1], 2, {"tp": "across nodes", "dp": "inside a node"}),
            ([0, 0, 1, 1], 4, {"tp": "across nodes"}),
        ):
            process.nodes = nodes.from_keys([(n, f"node{n}") for n in owner], "the test")
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                mesh = DeviceMesh(dp=4 // tp, tp=tp)
            assert mesh.placement == want, (owner, tp, mesh.placement)
            crossing = want["tp"] == "across nodes"
            warned = [w for w in seen if issubclass(w.category, mesh_module.MeshAcrossNodesWarning)]
            once = crossing and minipar.get_rank() == 0  # one line a job: the first rank's
            assert len(warned) == once, (owner, tp, [str(w.message) for w in seen])
            if once:
                assert "tp group spans nodes" in str(warned[0].message)
            if crossing:
                with pytest.raises(ValueError, match="refused"):
                    DeviceMesh(dp=4 // tp, tp=tp, across_nodes="refuse")
    finally:
        process.nodes = saved


def cases(size):
    if size == 4:
        return {**common_cases(), "placed_by_node": placed_by_node}
    return common_cases()


def common_cases():
    return {
        "cp_and_ep_layouts": cp_and_ep_layouts,
        "every_layout": every_layout,
        "pipeline_neighbours_talk": pipeline_neighbours_talk,
        "product_mismatch": product_mismatch,
        "bad_degrees": bad_degrees,
        "on_sub_group": on_sub_group,
    }
