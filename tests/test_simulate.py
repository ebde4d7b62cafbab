"""The simulated cluster (minipar/simulate/): the unchanged collectives on up to 4,096 ranks in
this one process, checked three ways: (a) their simulated time is their docstring's closed form,
(b) every collective and algorithm is right at odd and prime p on sizes p does not divide,
(c) all-reduce bus bandwidth on a DGX H100 cluster is nccl-tests' within 25%."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from minipar.collectives import api
from minipar.cost.links import Link
from minipar.errors import CommTimeoutError, MiniparError
from minipar.simulate import cluster as clusters
from minipar.simulate.conformance import check_collectives
from minipar.simulate.network import Network
from minipar.simulate.published import NCCL_TESTS, TOLERANCE
from minipar.simulate.runner import simulate
from minipar.simulate.sweep import all_reduce_row
from minipar.state import process

ALPHA, BW = 5e-6, 10e9
BETA = 1 / BW
FLAT = clusters.custom(Link("flat", ALPHA, BETA, 0.0), 8)


def closed_form(algorithm: str, p: int, n: float) -> float:
    """Each algorithm's docstring: steps and bytes on its critical path (n bytes in all)."""
    lg = int(math.log2(p))
    return {
        "ring": 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * n * BETA,
        "tree": 2 * lg * (ALPHA + n * BETA),
        "recursive_doubling": lg * (ALPHA + n * BETA),
        "rabenseifner": 2 * lg * ALPHA + 2 * (p - 1) / p * n * BETA,
    }[algorithm]


def all_reduce_time(algorithm: str, p: int, elements: int, contention: bool = False) -> float:
    def step(rank):
        x = np.full(elements, float(rank))
        api.all_reduce(x, algorithm=algorithm)
        assert x[0] == p * (p - 1) / 2
        return x

    return simulate(step, p, FLAT, contention=contention).time


@pytest.mark.parametrize(
    "algorithm, sizes",
    [
        ("ring", (2, 5, 64, 100)),
        ("tree", (2, 16, 1024)),
        ("recursive_doubling", (2, 64, 4096)),
        ("rabenseifner", (4, 256, 1024)),
    ],
)
def test_simulated_time_is_the_docstrings_closed_form(algorithm, sizes):
    chunked = algorithm in ("ring", "rabenseifner")  # they cut the buffer in p: p divides it
    for p in sizes:
        elements = 3 * p if chunked else 3  # (4,096 ranks x 3p doubles, sent: a gigabyte)
        want = closed_form(algorithm, p, 8.0 * elements)
        got = all_reduce_time(algorithm, p, elements)
        assert got == pytest.approx(want, rel=1e-12), (algorithm, p)
    # ports that carry one message at a time change nothing: no two messages share one
    p = sizes[1]
    elements = 3 * p if chunked else 3
    assert all_reduce_time(algorithm, p, elements, contention=True) == pytest.approx(
        closed_form(algorithm, p, 8.0 * elements), rel=1e-12
    )


ODD_AND_PRIME = (1, 2, 3, 5, 6, 7, 11, 13, 16, 31, 64, 97)


def test_every_collective_and_algorithm_is_right_at_odd_and_prime_p():
    wrong = []
    for p in ODD_AND_PRIME:
        wrong += check_collectives(p, n=p + 3 if p % 2 else 2 * p - 1)
    for p in (12, 24):  # nodes of 4: the two-level collectives run on 3 and 6 nodes
        wrong += check_collectives(p, n=p + 1, per_node=4)
    assert wrong == []


def test_the_two_level_all_reduce_meets_the_cost_models_figure():
    """The simulated world's node map is the cluster's: hierarchical finds 8 nodes of 8."""
    h100 = clusters.preset("h100")
    row = all_reduce_row(64, h100, 1 << 30, "hierarchical")
    assert row["wrong"] == 0 and row["time_s"] == pytest.approx(row["predicted_s"], rel=1e-9)
    ring = all_reduce_row(64, h100, 1 << 30, "ring")
    assert ring["time_s"] > 4 * row["time_s"]


def test_the_conformance_check_catches_an_off_by_one(monkeypatch):
    from minipar.collectives import registry, ring

    def broken(call, x, op):  # the ring, but the last rank skips its last chunk's reduction
        ring.all_reduce_ring(call, x, op)
        if call.rank == call.size - 1 and call.size > 5:
            x[-1] += 1

    monkeypatch.setitem(registry.ALGORITHMS["all_reduce"], "ring", broken)
    assert check_collectives(3, 7) == []
    wrong = check_collectives(7, 9)
    assert wrong == ["all_reduce ring p=7 n=9 rank 6: wrong result"]


@pytest.mark.parametrize("figure", [f for f in NCCL_TESTS if f["nodes"] <= 4])
def test_all_reduce_bus_bandwidth_meets_nccl_tests(figure):
    cluster = clusters.preset(figure["cluster"])
    ranks = figure["nodes"] * cluster.per_node
    row = all_reduce_row(ranks, cluster, figure["bytes"], figure["algorithm"])
    assert row["wrong"] == 0
    published = figure["busbw_GBps"]
    assert abs(row["busbw_GBps"] / published - 1) <= TOLERANCE, (row, figure["source"])


def test_one_ring_across_nodes_runs_at_one_nics_rate():
    """Why NCCL opens a ring per NIC: one ring crosses each node boundary once."""
    row = all_reduce_row(16, clusters.preset("h100"), 1 << 30, "ring")
    assert 45 < row["busbw_GBps"] <= 50  # one NDR NIC: 50 GB/s each way


def test_a_port_carries_one_message_at_a_time_and_ranks_share_a_nic():
    n = 1e6
    net = Network(FLAT, 4)
    first, second = net.send(0, 1, n, 0.0), net.send(0, 2, n, 0.0)  # one out-port
    assert (first, second) == pytest.approx((n * BETA + ALPHA, 2 * n * BETA + ALPHA))
    assert net.send(3, 2, n, 0.0) == pytest.approx(n * BETA + ALPHA)  # before 0 -> 2's turn
    assert net.send(3, 1, n, 0.0) == pytest.approx(2 * n * BETA + ALPHA)  # 3's and 1's ports
    # a message sent earlier but booked later fills the gap before a later one
    net.send(1, 3, n, 10.0)
    assert net.send(1, 3, n, 0.0) == pytest.approx(n * BETA + ALPHA)
    pcie, h100 = clusters.preset("pcie"), clusters.preset("h100")  # 1 NIC a node, 8
    for cluster, k in ((pcie, 2), (h100, 1)):
        net = Network(cluster, 16)
        beta = cluster.inter.beta
        ends = [net.send(r, 8 + r, n, 0.0) for r in range(2)]  # ranks 0, 1 -> node 1
        assert max(ends) == pytest.approx(k * n * beta + cluster.inter.alpha)


def test_a_deadlock_raises_and_the_process_state_is_put_back():
    before = (process.world, dict(process.groups), process.fast_paths, process.nodes)

    def step(rank):
        x = np.zeros(4)
        if rank == 0:
            api.broadcast(x, 1, algorithm="linear")  # rank 1 never calls it
        return rank

    with pytest.raises(CommTimeoutError, match="deadlocked"):
        simulate(step, 3, FLAT)
    assert (process.world, dict(process.groups), process.fast_paths, process.nodes) == before

    def fails(rank):
        if rank == 2:
            raise ValueError("rank 2's own error")
        api.barrier()

    with pytest.raises(ValueError, match="rank 2's own error"):  # the cause, not the deadlock
        simulate(fails, 4, FLAT)


def test_a_simulated_world_leaves_no_threads_behind():
    """Its ranks' raw threads leave nothing in threading.enumerate() (before Python 3.13 a
    thread that asked for current_thread() stayed listed after its end): the watchdog reads
    that list, and a real rank in the same process could no longer prove a mismatch (issue 71:
    lesson 11 left 905 on a warm test rank)."""
    import threading

    def step(rank):
        threading.current_thread()  # as minipar's waits do beside a progress thread (base.py)
        api.all_reduce(np.ones(8))

    before = {t.ident for t in threading.enumerate()}
    simulate(step, 16, FLAT)
    left = [t.name for t in threading.enumerate() if t.ident not in before]
    assert not left, f"{len(left)} threads listed after the simulated world ended: {left[:5]}"


def test_groups_split_and_scaled_bytes():
    def step(rank):
        import minipar.runtime as runtime

        evens = runtime.new_group([0, 2, 4])
        x = np.full(6, float(rank))
        if rank % 2 == 0:
            api.all_reduce(x, group=evens, algorithm="ring")
        return x

    run = simulate(step, 5, FLAT, scale=1000.0)
    assert [r[0] for r in run.results] == [6.0, 1.0, 6.0, 3.0, 6.0]
    chunk = 6 // 3 * 8 * 1000.0  # one ring chunk, in simulated bytes
    assert run.time == pytest.approx(4 * (ALPHA + chunk * BETA))
    assert run.bytes == pytest.approx(3 * 4 * chunk)


def test_bad_links_and_clusters_name_the_bad_value():
    link = clusters.parse_link("alpha=2us,bw=400Gbit/s")
    assert (link.alpha, 1 / link.beta) == pytest.approx((2e-6, 50e9))
    for text, bad in (("alpha=5us", "both"), ("alpha=x,bw=1GB/s", "'x'"), ("a=1,bw=2", "a=1")):
        with pytest.raises(ValueError, match=bad):
            clusters.parse_link(text)
    with pytest.raises(ValueError, match="'dgx'"):
        clusters.preset("dgx")
    with pytest.raises(ValueError, match="ranks per node must be a positive integer, got 0"):
        clusters.preset("h100").with_per_node(0)
    with pytest.raises(MiniparError, match="not simulated"):
        simulate(lambda rank: process.world.barrier(), 2, FLAT)


def test_cli_prints_a_table_and_writes_json(tmp_path, capsys):
    from minipar.cli import main

    out = tmp_path / "sim.json"
    argv = ["simulate", "all_reduce", "--ranks", "16", "--per-node", "8", "--cluster", "h100"]
    argv += ["--sizes", "1MiB,64MiB", "--algorithms", "ring,tree", "--json"]
    assert main([*argv, str(out)]) == 0
    text = capsys.readouterr().out
    assert "busbw" in text
    rows = json.loads(out.read_text())
    assert [(r["algorithm"], r["nbytes"]) for r in rows] == [
        ("ring", 1 << 20),
        ("tree", 1 << 20),
        ("ring", 64 << 20),
        ("tree", 64 << 20),
    ]
    ring = rows[2]
    assert ring["wrong"] == 0 and ring["time_s"] == pytest.approx(ring["predicted_s"])
    bad = ["simulate", "all_reduce", "--link", "alpha=1us,bw=fast", "--sizes", "1MiB"]
    assert main(bad) == 2
    assert "'fast'" in capsys.readouterr().out
    assert main(["simulate", "all_reduce", "--sizes", "0"]) == 2
    assert "every size must be at least 1 byte" in capsys.readouterr().out
    assert main(["simulate", "all_reduce", "--algorithms", "rign"]) == 2
    assert "'rign'" in capsys.readouterr().out


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipeline_steps_bubble_is_the_formula_when_messages_are_free(tmp_path, schedule):
    from minipar.comm.trace import chrome_trace
    from minipar.simulate.train_step import Step, simulate_step, write_timeline

    free = clusters.custom(Link("free", 0.0, 1e-30, 0.0), 8)
    step = Step(2, 4, 8, 1e-3, 1.0, 1.0, schedule=schedule)
    run = simulate_step(step, free)
    assert run.bubble == pytest.approx(3 / 11, rel=1e-9)  # (p-1)/(m+p-1)
    assert run.time == pytest.approx(1e-3 * 3 * (8 + 3), rel=1e-9)  # (m+p-1)(f+b)
    doc = json.loads(open(write_timeline(run, str(tmp_path / "step.json"))).read())
    assert chrome_trace.validate(doc) == []
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == set(range(8))
    assert sum(e["name"].startswith("Backward") for e in slices) == 8 * 8  # m per rank


def test_cli_simulates_a_planned_training_step(tmp_path, capsys):
    from minipar.cli import main

    trace = tmp_path / "step.json"
    argv = ["simulate", "train", "--model", "7b", "--gpus", "16", "--trace", str(trace)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "bubble" in out and "simulated ranks" in out and trace.exists()
    assert main(["simulate", "train", "--model", "nope"]) == 2
    assert "'nope'" in capsys.readouterr().out


def test_object_all_gathers_one_after_another():
    def step(rank):
        comm = process.world
        return [comm.allgather_object((k, rank)) for k in range(3)]

    run = simulate(step, 3, FLAT)
    assert run.results[2] == [[(k, r) for r in range(3)] for k in range(3)]
    assert run.time == 0.0  # the control plane costs no simulated time
