"""The two-level collectives on a node map set as data: 4 real MPI ranks told they run on 2
nodes of 2 (and on 4 x 1, 1 x 4, nodes not holding consecutive ranks, and unequal nodes). The
bytes move for real, through the same messages they would take across emulated or real nodes;
only the map saying which peer is "another node" is given, so these run on any machine
(`minipar run --nodes 2 -n 4` runs the same code on nodes the MPI library itself reports).

Cases of collectives.py's 4-rank launch (cases() adds them): results against numpy (integers:
exact; floats: collectives.py's bound for any summation order, since a two-level sum adds
inside the node first), bitwise the same on every rank, bitwise the flat ring's on one node and
for integers; the ledger's steps and bytes inside and between nodes against
minipar.cost.traffic_on_nodes (the table in collectives/hierarchical.py); `auto`'s choice.
"""

import contextlib
import os

import numpy as np
from collectives import Digests, assert_close, make, reference, values, world

import minipar
from minipar import cost
from minipar.collectives.reduce_op import ReduceOp
from minipar.runtime import devices, nodes
from minipar.runtime.devices import LOCAL_RANK_ENV
from minipar.state import process

SUM = ReduceOp.SUM
MAPS = {  # node of each of the 4 ranks
    "2x2": [0, 0, 1, 1],
    "2x2_interleaved": [0, 1, 0, 1],
    "4x1": [0, 1, 2, 3],
    "1x4": [0, 0, 0, 0],
    "unequal_3+1": [0, 0, 0, 1],
}


@contextlib.contextmanager
def node_map(owner):
    """The world's node map says rank r runs on node owner[r] inside the block."""
    saved = process.nodes
    process.nodes = nodes.from_keys([(n, f"node{n}") for n in owner], "set by the test")
    try:
        yield
    finally:
        process.nodes = saved


def results_case():
    """Every two-level collective against numpy, on every map; all-reduce bitwise identical on
    every rank, and bitwise the flat ring's for integers (and on one node, for floats too)."""
    w = world()
    p, r = w.size, w.rank
    for label, owner in MAPS.items():
        with node_map(owner):
            digests = Digests()
            for dtype in ("int32", "float32", "float64"):
                for n in (0, 1, 3, 1031):
                    what = f"{label} {dtype} n={n}"
                    parts = [make("numpy", dtype, values(q, n, dtype, SUM)) for q in range(p)]
                    want = reference(parts, dtype, SUM, "numpy")
                    x, flat = parts[r].copy(), parts[r].copy()
                    minipar.all_reduce(x, algorithm="hierarchical")
                    minipar.all_reduce(flat, algorithm="ring")
                    assert_close(x, want, parts, dtype, SUM, f"all_reduce {what}")
                    digests.add(x, f"all_reduce {what}")
                    if dtype == "int32" or label == "1x4":
                        assert np.array_equal(x, flat), f"{what}: not the flat ring's bits"
                    moving_and_scattering(parts, dtype, n, what)
            digests.check(w)


def moving_and_scattering(parts, dtype, n, what):
    w = world()
    p, r = w.size, w.rank
    out = np.zeros(p * n, dtype)
    minipar.all_gather_into_tensor(out, parts[r], algorithm="hierarchical")
    assert np.array_equal(out, np.concatenate(parts)), f"all_gather {what}"
    for root in range(p):
        x = parts[r].copy()
        minipar.broadcast(x, root, algorithm="hierarchical")
        assert np.array_equal(x, parts[root]), f"broadcast {what} root={root}"
    full = [make("numpy", dtype, values(q, p * n, dtype, SUM, 1)) for q in range(p)]
    inp, got = full[r].copy(), np.zeros(n, dtype)
    minipar.reduce_scatter_tensor(got, inp, algorithm="hierarchical")
    blocks = [f[r * n : (r + 1) * n] for f in full]
    want = reference(blocks, dtype, SUM, "numpy")
    assert_close(got, want, blocks, dtype, SUM, f"reduce_scatter {what}")
    assert np.array_equal(inp, full[r]), f"reduce_scatter {what}: input changed"


def run(collective, algorithm, x, n, r):
    if collective == "all_reduce":
        minipar.all_reduce(x, algorithm=algorithm)
    elif collective == "all_gather":
        minipar.all_gather_into_tensor(x, x[r * n : (r + 1) * n].copy(), algorithm=algorithm)
    elif collective == "reduce_scatter":
        minipar.reduce_scatter_tensor(np.empty(n, x.dtype), x, algorithm=algorithm)
    else:
        minipar.broadcast(x, 1, algorithm=algorithm)


def ledger_case():
    """On 2 nodes of 2: the busiest rank's steps, bytes inside and bytes between nodes equal
    traffic_on_nodes, for the two-level schemes and the flat ring (exactly: counts divide)."""
    w = world()
    p, r = w.size, w.rank
    with node_map(MAPS["2x2"]):
        for collective in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
            for algorithm in ("hierarchical", "ring"):
                count = 4096 * p
                x = np.ones(count, np.float32)
                with minipar.trace() as t:
                    run(collective, algorithm, x, count // p, r)
                call = t.calls[-1]
                inter = t.bytes_sent(link="inter")
                assert inter == call.bytes_between_nodes
                assert t.bytes_sent(link="intra") + inter == t.bytes_sent()
                mine = (call.steps, t.bytes_sent(link="intra"), inter)
                steps, intra, inter = (max(v) for v in zip(*w.allgather_object(mine)))
                inside, between = cost.traffic_on_nodes(collective, algorithm, x.nbytes, 2, 2)
                what = f"{collective}/{algorithm} on 2x2"
                assert steps == inside.steps + between.steps, f"{what}: {steps} steps"
                assert inter == between.bytes_sent, f"{what}: {inter} B between nodes"
                if algorithm == "hierarchical":  # (the flat ring's own bytes: the 1-node ledger)
                    assert intra == inside.bytes_sent, f"{what}: {intra} B inside nodes"


SLOW = minipar.cost.Link("between nodes", 50e-6, 1 / 0.25e9, 1 / 5e9)  # 2 Gbit/s, shared


def auto_case():
    """With a slow link between nodes, `auto` takes the two-level all-reduce (plain or
    pipelined: which, tests/test_pipelined_two_level.py) for a large buffer on 2 x 2, and never
    on one node; the model's ratio ring / hierarchical on 2 x 2 is about
    1.5 (the node's link carries 2 (p-1)/p S against 2 (N-1)/N S)."""
    w = world()
    x = np.ones(1 << 18, np.float32)
    cost.set_inter_link(SLOW)
    try:
        for label, across in (("2x2", True), ("1x4", False)):
            with node_map(MAPS[label]), minipar.trace() as t:
                minipar.all_reduce(x, algorithm="auto")
            got = t.calls[-1].algorithm
            assert got.startswith("hierarchical") == across, f"{label}: auto chose {got}"
    finally:
        cost.set_inter_link(None)
    assert (x == w.size**2).all()
    fast = cost.SHARED_MEMORY
    flat = cost.predict_on_nodes("all_reduce", "ring", 64 << 20, 2, 2, fast, SLOW)
    two = cost.predict_on_nodes("all_reduce", "hierarchical", 64 << 20, 2, 2, fast, SLOW)
    assert 1.3 < flat / two < 1.6, f"ring / hierarchical predicted {flat / two:.2f} on 2 x 2"


def pipelined_case():
    """hierarchical_pipelined on 2 x 2 and 4 x 1, in pieces (a slow link between nodes makes
    the cost model cut several): bitwise hierarchical's on a size the pieces do not divide;
    on a size they do, the ledger's bytes inside and between nodes are 2 (k-1)/k S and
    2 (N-1)/N S/k, and its steps (C+1) R + 2 (k-1), R = max(2 (k-1), 2 (N-1)) (on nodes of
    one rank: the ring across, 2 (N-1) steps)."""
    w = world()
    p, r = w.size, w.rank
    saved = dict(process.links)
    cost.set_default_link(cost.SHARED_MEMORY)  # not this machine's calibration: C > 1 at 4 MiB
    cost.set_inter_link(SLOW)
    try:
        for label, N, k in (("2x2", 2, 2), ("4x1", 4, 1)):
            with node_map(MAPS[label]):
                for dtype in ("float32", "float64"):
                    parts = [
                        make("numpy", dtype, values(q, 3 * 8191 + 5, dtype, SUM)) for q in range(p)
                    ]
                    a, b = parts[r].copy(), parts[r].copy()
                    minipar.all_reduce(a, algorithm="hierarchical")
                    minipar.all_reduce(b, algorithm="hierarchical_pipelined")
                    assert a.tobytes() == b.tobytes(), f"{label} {dtype}: not hierarchical's bits"
                x = np.ones(1 << 20, np.float32)  # 4 MiB: p divides it
                with minipar.trace() as t:
                    minipar.all_reduce(x, algorithm="hierarchical_pipelined")
                assert (x == p).all(), f"{label}: wrong sum"
                S, C = x.nbytes, cost.pipeline_chunks(x.nbytes, N, k)
                mine = (t.calls[-1].steps, t.bytes_sent(link="intra"), t.bytes_sent(link="inter"))
                steps, intra, inter = (max(v) for v in zip(*w.allgather_object(mine)))
                R = max(2 * (k - 1), 2 * (N - 1))
                if k == 1:  # nothing inside to overlap: the ring across, as hierarchical
                    R, C = 2 * (N - 1), 0
                assert steps == (C + 1) * R + 2 * (k - 1), f"{label}: {steps} steps"
                assert C > 1 or k == 1, f"{label}: {C} pieces"
                assert intra == 2 * (k - 1) / k * S, f"{label}: {intra} B inside"
                assert inter == 2 * (N - 1) / N * S / k, f"{label}: {inter} B between"
    finally:
        process.links.clear()
        process.links.update(saved)


def local_rank_case():
    """local_rank() where no launcher said it (none of Open MPI's, Hydra's, MVAPICH's,
    torchrun's or Slurm's variables): this rank's index among the ranks of its node, counted
    here from the map, on nodes of interleaved and of unequal ranks."""
    w = world()
    saved_env = {name: os.environ.pop(name) for name, _ in LOCAL_RANK_ENV if name in os.environ}
    saved = (process.local_rank, process.local_rank_source, process.device)
    try:
        for owner in (MAPS["2x2_interleaved"], MAPS["unequal_3+1"]):
            mine = [q for q in range(w.size) if owner[q] == owner[w.rank]]
            with node_map(owner):
                devices.forget()
                assert minipar.local_rank() == mine.index(w.rank), (owner, minipar.local_rank())
                assert process.local_rank_source == "set by the test"
                assert minipar.local_world_size() == len(mine)
                assert minipar.node_rank() == sorted(set(owner)).index(owner[w.rank])
    finally:
        os.environ.update(saved_env)
        process.local_rank, process.local_rank_source, process.device = saved


def agreed_link_case():
    """Ranks that would price `auto` differently (here rank 1 and 3 hold links of their own, as
    a host with its own calibration file would) take rank 0's (both links) when init gathers
    the node map, and then `auto` picks the same algorithm everywhere: no rank waits in
    another's algorithm."""
    w = world()
    saved_nodes, saved_links = process.nodes, dict(process.links)
    odd = cost.Link("odd host", alpha=1.0, beta=1e-15, gamma=0.0)  # latency-bound: a tree there
    mine = odd if w.rank % 2 else cost.SHARED_MEMORY
    try:
        cost.set_default_link(mine)
        cost.set_inter_link(odd if w.rank % 2 else SLOW)  # the link between nodes too
        nodes.remember(w)
        assert cost.default_link() == cost.SHARED_MEMORY, (w.rank, cost.default_link())
        assert cost.inter_link() == SLOW, (w.rank, cost.inter_link())
        x = np.ones(1 << 16, np.float32)
        with minipar.trace() as t:
            minipar.all_reduce(x, algorithm="auto")
        chosen = w.allgather_object(t.calls[-1].algorithm, "the test's check")
        assert len(set(chosen)) == 1, chosen
        assert (x == w.size).all()
    finally:
        process.nodes = saved_nodes
        process.links.clear()
        process.links.update(saved_links)


def cases(size):
    if size != 4:
        return {}
    return {
        "nodes.results": results_case,
        "nodes.ledger": ledger_case,
        "nodes.auto": auto_case,
        "nodes.pipelined": pipelined_case,
        "nodes.local_rank": local_rank_case,
        "nodes.agreed_link": agreed_link_case,
    }
