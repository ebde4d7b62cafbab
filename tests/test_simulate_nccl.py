"""The simulator as NCCL: its protocols priced as NCCL's tuner prices them, its per-size pick,
NCCL's channels across nodes at the NICs' rate, NVLink SHARP, and every published figure
(minipar/simulate/published.py) within its bound (a few seconds in all).

The expected times are written here from NCCL's src/graph/tuning.cc and topo.h by hand (base
and hop latencies in microseconds, 20.6 GB/s an NVLink link x 18 on an H100), not read from
minipar/simulate/protocols.py.

Checks: minipar/simulate/protocols.py, nvls.py, nccl_tree.py, published.py, validate.py (and
sweep.py's NCCL rows). Where a rule matters only on some shapes (uneven nodes, 3 nodes, the
NVLink side binding, ranks arriving apart) a case of that shape is here; the planted bugs each
catches are listed in docs/testing.md."""

from __future__ import annotations

import pytest

from minipar.simulate import cluster as clusters
from minipar.simulate.protocols import choose, nccl_time
from minipar.simulate.published import FIGURES, GEOMEAN, TOLERANCE
from minipar.simulate.sweep import row
from minipar.simulate.validate import validate, within

H100 = clusters.preset("h100")
US, GiB, MiB = 1e-6, 1 << 30, 1 << 20
NVLINK = 20.6e9 * 18  # NCCL's H100 NVLink: 370.8 GB/s


def test_every_published_figure_is_met_within_its_bound():
    results, summary = validate()
    held = [r for r in results if r["held"]]
    assert summary["wrong"] == 0
    assert len(held) >= 12
    assert {r["nodes"] for r in held} >= {1, 2, 4, 16}
    assert {r["collective"] for r in held} == {"all_reduce", "all_gather", "reduce_scatter"}
    assert min(r["bytes"] for r in held) == 8 and max(r["bytes"] for r in held) == 8 * GiB
    assert summary["geomean"] <= GEOMEAN, summary
    missed = [(r["collective"], r["ranks"], r["bytes"], r["ratio"]) for r in held]
    assert all(within(r, TOLERANCE) for r in held), missed
    assert all(f["source"] for f in FIGURES)


def test_a_protocol_prices_the_ring_as_nccls_formula():
    """8 H100, one node: base + 14 hops + 2 (p-1)/p n at the protocol's share of NVLink."""
    n = 8 * MiB
    ll = row("all_reduce", 8, H100, n, "ring", "LL")
    # LL: half of NVLink, capped at llMaxBw = 141 GB/s on one Hopper node
    want = 6.6 * US + 14 * (0.6 * US + n / 8 / min(0.5 * NVLINK, 141e9))
    assert ll["time_s"] == pytest.approx(want, rel=1e-9) and ll["wrong"] == 0
    simple = row("all_reduce", 8, H100, GiB, "ring", "Simple")
    want = 8.4 * US + 14 * (3.4 * US + GiB / 8 / NVLINK)
    assert simple["time_s"] == pytest.approx(want, rel=1e-9)
    ll128 = row("all_gather", 8, H100, GiB, "ring", "LL128")
    want = 14.0 * US + 7 * (1.9 * US + GiB / 8 / (0.92 * NVLINK))
    assert ll128["time_s"] == pytest.approx(want, rel=1e-9)
    # with no protocol the cluster's own links: the ring's closed form, 3 us and 450 GB/s
    plain = row("all_reduce", 8, H100, GiB, "ring")
    assert plain["time_s"] == pytest.approx(14 * (3e-6 + GiB / 8 / 450e9), rel=1e-12)


def test_the_tuner_picks_the_cheapest_pair_by_nccls_formula():
    assert choose("all_reduce", 8, 8, H100) == ("ring", "LL")  # 15.0 us against tree's 15.2
    assert nccl_time("all_reduce", "ring", "LL", 0, 8, H100) == pytest.approx(15.0 * US)
    assert nccl_time("all_reduce", "double_tree", "LL", 0, 8, H100) == pytest.approx(15.2 * US)
    assert choose("all_reduce", GiB, 8, H100) == ("nvls", "Simple")
    assert choose("all_gather", GiB, 8, H100) == ("ring", "Simple")
    # 16 nodes, 8 B: the tree's 2 (7 NVLink hops + log2 16 network hops) beat the ring's 254
    tree = 6.8 + 2 * (7 * 0.6 + 4 * 5.0)
    ring = 6.6 + (254 - 30) * 1.0 + 30 * 2.7  # an intra hop across nodes costs the proxy's 1 us
    assert choose("all_reduce", 8, 128, H100) == ("double_tree", "LL")
    assert nccl_time("all_reduce", "double_tree", "LL", 0, 128, H100) == pytest.approx(tree * US)
    assert nccl_time("all_reduce", "ring", "LL", 0, 128, H100) == pytest.approx(ring * US)
    picked = row("all_reduce", 8, H100, 8, "nccl")
    assert (picked["algorithm"], picked["protocol"]) == ("nccl:ring", "LL")


def test_channels_across_nodes_run_at_the_nics_rate_and_pipeline():
    """2 nodes: each ring step moves 7/8 of its bytes on NVLink and 1/8 on the GPU's NIC, all
    8 channels at once, so the step runs at min(450 x 8/7, 8 x 50) = 400 GB/s."""
    p, n = 16, GiB
    plain = row("all_reduce", p, H100, n, "rings")
    # sends complete on arrival: the node's last GPU pays the network's 6 us every step
    assert plain["time_s"] == pytest.approx(30 * (6e-6 + n / p / 400e9), rel=1e-9)
    simple = row("all_reduce", p, H100, n, "rings", "Simple")
    # NCCL's slots in flight: a step waits for what its left neighbour sent, so the critical
    # path moves one rank a step: 30 hops around a ring of 16 cross the 2 node boundaries 4
    # times (14 us each; NCCL's formula counts 2 (nodes - 1) = 2), NVLink's 3.4 us the others
    want = 8.4 * US + 26 * 3.4 * US + 4 * 14 * US + 30 * n / p / 400e9
    assert simple["time_s"] == pytest.approx(want, rel=1e-9) and simple["wrong"] == 0
    assert simple["busbw_GBps"] == pytest.approx(400 * n * 30 / 16 / 400e9 / simple["time_s"])


def test_nvlink_sharp_sums_in_the_switch():
    """Each GPU's port carries n (1 + 1/p) bytes at 0.85 of NCCL's NVLink, after 25 us, plus
    two loops of the three-stage pipeline: 16 channels x p heads x a chunk (1 GiB: 128 KiB;
    4 MiB on 8 GPUs: 16 KiB, as 4 MiB < 2 loops of 32 KiB chunks = 8 MiB)."""
    for p, n, chunk in ((4, GiB, 128 << 10), (8, GiB, 128 << 10), (8, 4 << 20, 16 << 10)):
        nvls = row("all_reduce", p, H100, n, "nvls", "Simple")
        want = 25 * US + (n + 2 * 16 * p * chunk) * (1 + 1 / p) / (0.85 * NVLINK)
        assert nvls["time_s"] == pytest.approx(want, rel=1e-9) and nvls["wrong"] == 0
        assert nvls["messages"] == 0


def test_cli_validates_and_sweeps_with_nccls_pick(capsys, monkeypatch):
    from minipar.cli import main
    from minipar.simulate import validate as module

    monkeypatch.setattr(module, "FIGURES", FIGURES[:2])  # the whole table: the test above
    assert main(["simulate", "validate"]) == 0
    out = capsys.readouterr().out
    assert "geometric-mean error" in out and "NVIDIA/nccl-tests#212" in out
    argv = ["simulate", "all_reduce", "--ranks", "8", "--sizes", "8B,1GiB", "--algorithms"]
    assert main([*argv, "nccl,ring", "--protocol", "nccl"]) == 0
    out = capsys.readouterr().out
    assert "nccl:ring" in out and "LL" in out and "nccl:nvls" in out
    assert main([*argv, "ring", "--protocol", "LL256"]) == 2
    assert "'LL256'" in capsys.readouterr().out


def test_nccls_constants_are_its_tuning_sources():
    """The constants as NVIDIA/nccl src/graph/tuning.cc gives them (ncclTunerConstantsDefaults:
    its baseLatencies and hwLatencies tables, microseconds, LL / LL128 / Simple; llMaxBws;
    getNetOverhead on x86 Intel), typed here from that file, not from protocols.py."""
    from minipar.simulate import protocols as P

    assert P.BASE["tree"] == {"LL": 6.8, "LL128": 14.0, "Simple": 8.4}
    assert P.BASE["ring"] == {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}
    assert P.HOP["nvlink"]["tree"] == {"LL": 0.6, "LL128": 1.25, "Simple": 4.0}
    assert P.HOP["nvlink"]["ring"] == {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}
    assert P.HOP["net"]["tree"] == {"LL": 5.0, "LL128": 8.5, "Simple": 14.0}
    assert P.HOP["net"]["ring"] == {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}
    assert P.HOP["nvlink"]["nvls"]["Simple"] == 25.0 and P.HOP["net"]["nvls"]["Simple"] == 18.0
    assert P.LL_MAX_BW_NET == {2: 39.0, 3: 20.4} and P.NET_OVERHEAD_US == 1.0
    # treeCorrectionFactor (ncclTopoGetAlgoTime): a tree's bandwidth at bytes / 64 = 2^i
    assert not hasattr(P, "NET_PROXY_US")  # no fitted start-up across nodes any more
    assert P.tree_correction("LL", 256 << 10) == 0.4  # i = 12: LL's row .4
    assert P.tree_correction("LL128", MiB) == 0.6  # i = 14
    assert P.tree_correction("Simple", 64) == 0.9 and P.tree_correction("Simple", GiB) == 1.0
    assert P.tree_correction("LL", 8) == 1.0  # below 64 B: no factor


def test_nccls_tree_across_nodes_is_a_chain_and_a_tree_of_log2_depth():
    """8 B by LL on 2, 4 and 16 nodes of 8: 7 NVLink hops up the chain and log2(nodes)
    network hops up the tree, and back: the tuner's 2 (7 x 0.6 + log2 N x 5.0) + 6.8 (25.2 us
    on 2 nodes: nccl-tests#309 measured 24.7); a ring would pay 2 (p-1) hops (on 16 nodes
    254), as before this tree."""
    for nodes in (2, 4, 16):
        r = row("all_reduce", 8 * nodes, H100, 8, "nccl")
        depth = {2: 1, 4: 2, 16: 4}[nodes]
        want = (6.8 + 2 * (7 * 0.6 + depth * 5.0)) * US
        assert r["algorithm"] == "nccl:nccl_tree" and r["protocol"] == "LL"
        # 8 bytes' own transfer time is a few nanoseconds: within 0.01 us
        assert r["time_s"] == pytest.approx(want, abs=0.01 * US) and r["wrong"] == 0


def test_the_per_class_table_is_computed_from_the_figures():
    """Geometric-mean and worst error per size class and node count, over the held-out split,
    recomputed here by hand from each figure's ratio."""
    import math

    from minipar.simulate.validate import class_table, table_lines

    results, _ = validate()
    table = class_table(results)
    held = [r for r in results if r["held"] and r["split"] == "held-out"]
    assert any(r["split"] == "fit" for r in results)
    classes = {"<= 64 KiB": (0, 64 << 10), "64 KiB-16 MiB": ((64 << 10) + 1, (16 << 20) - 1),
               ">= 16 MiB": (16 << 20, float("inf"))}  # fmt: skip
    for name, (low, high) in classes.items():
        mine = [r for r in held if low <= r["bytes"] <= high]
        for nodes in {r["nodes"] for r in mine} | {"all"}:
            cell = [r for r in mine if nodes == "all" or r["nodes"] == nodes]
            got = next(t for t in table if t["class"] == name and t["nodes"] == nodes)
            assert got["count"] == len(cell)
            if cell:
                logs = [abs(math.log(r["simulated"] / r["value"])) for r in cell]
                assert got["geomean"] == pytest.approx(math.exp(sum(logs) / len(logs)) - 1)
                assert got["worst"] == pytest.approx(
                    max(abs(r["simulated"] / r["value"] - 1) for r in cell)
                )
    text = "\n".join(table_lines(results))
    # the goal (geomean <= 10%, worst <= 25% in every class) is not met yet: the table says so
    # by showing every class, the empty mid-size one included, and what was fitted
    assert all(name in text for name in classes) and "fitted to" in text


def test_the_per_class_table_of_a_hand_worked_set():
    """Four figures worked by hand: <= 64 KiB on 2 nodes at ratios 1.1 and 1/1.1 (geomean
    |ln| = ln 1.1: 10.0%; worst |r - 1| = 10.0%), 1 MiB on 4 nodes at 0.8 (geomean 25.0%, the
    log-symmetric 1/0.8 - 1; worst 20.0%); a fit figure and an unheld one are left out."""
    from minipar.simulate.validate import class_table

    def fig(nbytes, nodes, ratio, split="held-out", held=True):
        return {"bytes": nbytes, "nodes": nodes, "ratio": ratio, "split": split, "held": held}

    results = [fig(8, 2, 1.1), fig(4096, 2, 1 / 1.1), fig(MiB, 4, 0.8),
               fig(8, 2, 3.0, split="fit"), fig(8, 2, 3.0, held=False)]  # fmt: skip
    table = {(t["class"], t["nodes"]): t for t in class_table(results)}
    small = table["<= 64 KiB", 2]
    assert small["count"] == 2 and small["geomean"] == pytest.approx(0.10)
    assert small["worst"] == pytest.approx(0.10)
    assert table["<= 64 KiB", "all"]["count"] == 2
    mid = table["64 KiB-16 MiB", 4]
    assert mid["count"] == 1 and mid["geomean"] == pytest.approx(0.25)
    assert mid["worst"] == pytest.approx(0.20)
    assert table[">= 16 MiB", "all"] == {
        "class": ">= 16 MiB",
        "nodes": "all",
        "count": 0,
        "geomean": None,
        "worst": None,
    }


def test_a_class_of_low_figures_has_a_geomean_above_its_worst():
    """Two 2-node mid-size figures simulated 25.2% and 30.1% low (the ratios 0.748, 0.699):
    worst |r - 1| = 30.1%; geomean exp((|ln 0.748| + |ln 0.699|) / 2) - 1 = exp((0.29035 +
    0.35810) / 2) - 1 = 38.3%. Not a typo: the columns are two measures, and the table says so."""
    from minipar.simulate.validate import MEASURES, class_table, table_lines

    results = [{"bytes": n, "nodes": 2, "ratio": r, "split": "held-out", "held": True}
               for n, r in ((MiB, 0.748), (4 * MiB, 0.699))]  # fmt: skip
    mid = next(t for t in class_table(results) if t["nodes"] == 2)
    assert mid["worst"] == pytest.approx(0.301)
    assert mid["geomean"] == pytest.approx(0.383, abs=5e-4) and mid["geomean"] > mid["worst"]
    assert 1 / 0.7 - 1 == pytest.approx(0.4286, abs=1e-4) and "30% low counts 43%" in MEASURES
    assert any(MEASURES in line for line in table_lines([]))


# -- rules that change the answer only on some shapes (issue 72's planted bugs) -----------------


def test_ranks_that_do_not_fill_their_last_node_still_count_it():
    """12 ranks of 8 a node are 2 nodes (ceil): the ring's 2 (nodes - 1) network hops at 2.7
    us, the other 20 at the proxy's 1 us (not 22 NVLink hops at 0.6 us, one node's figure)."""
    got = nccl_time("all_reduce", "ring", "LL", 0, 12, H100)
    assert got == pytest.approx((6.6 + 20 * 1.0 + 2 * 2.7) * US)


def test_the_tree_on_3_nodes_is_floor_log2_deep():
    """NCCL's tuner (tuning.cc: log2i, a floor) counts 1 network level for 3 nodes, not 2."""
    got = nccl_time("all_reduce", "double_tree", "LL", 0, 24, H100)
    assert got == pytest.approx((6.8 + 2 * (7 * 0.6 + 1 * 5.0)) * US)


def test_ll_across_nodes_is_capped_by_llmaxbw_for_2_nodes_and_for_more():
    """LL's bus bandwidth across nodes is llMaxBw: 39 GB/s on 2 nodes, 20.4 on 3 or more (x86
    Intel, tuning.cc), whatever the 8 NICs could carry; the time's size term, by hand."""
    for nodes, cap in ((2, 39e9), (3, 20.4e9), (4, 20.4e9)):
        p = 8 * nodes
        steps = 2 * (p - 1)
        size_term = nccl_time("all_reduce", "ring", "LL", GiB, p, H100) - nccl_time(
            "all_reduce", "ring", "LL", 0, p, H100
        )
        assert size_term == pytest.approx(GiB * steps / (p * cap), rel=1e-9), nodes


def test_a_gpus_nvlink_binds_when_its_nics_are_faster():
    """NICs of 400 GB/s each (8 a node): a ring step's 7/8 on NVLink binds, so the bus runs at
    370.8 x 8/7 GB/s (Simple, 2 nodes), not at the NICs' 8 x 400."""
    from dataclasses import replace

    fast = replace(H100, inter=replace(H100.inter, beta=1 / 400e9))
    p, steps = 16, 30
    # at 1 GiB the ring's latency is NCCL's plateau, 1.4 x (test below); at 0 bytes it is not
    size_term = nccl_time("all_reduce", "ring", "Simple", GiB, p, fast) - 1.4 * nccl_time(
        "all_reduce", "ring", "Simple", 0, p, fast
    )
    assert size_term == pytest.approx(GiB * steps / (p * NVLINK * 8 / 7), rel=1e-9)


def test_nccls_trees_heads_carry_half_the_nodes_nics_each():
    """Two tree heads stand for 8 NICs: each at 4 NICs' rate, 4 x 50 GB/s."""
    from minipar.simulate.protocols import flow_level_trees

    assert flow_level_trees(H100, 2).inter.beta == pytest.approx(1 / 200e9, rel=1e-12)
    assert flow_level_trees(H100, 1) is H100


def test_nvls_starts_at_the_last_arrival():
    """Rank r arrives r ms late: the switch's sum starts when the last (rank 3) is there, so
    every clock ends at 3 ms + the switch's time, and every rank holds the sum."""
    import numpy as np

    from minipar.simulate.nvls import all_reduce_nvls
    from minipar.simulate.runner import simulate
    from minipar.state import process

    def step(rank):
        process.world.task.clock += rank * 1e-3
        x = np.full(4, float(rank + 1), dtype=np.float32)
        all_reduce_nvls(x, lambda nbytes, p: 5e-6)
        return x

    run = simulate(step, 4, H100)
    assert run.clocks == pytest.approx([3e-3 + 5e-6] * 4, rel=1e-12)
    assert all((x == 10.0).all() for x in run.results)


def test_nccls_tree_chunks_as_its_calccollchunking_worked_by_hand():
    """NCCL 2.26.2 enqueue.cc, worked here: an LL128 slot is 4,915,200 / 8 = 614,400 bytes,
    576,000 of data; on 4 x 8 (ppn 8) the tree's steps are 1 + 2 + 0.8 = 3.8, so at 4 MiB on
    16 channels the chunk halves to 72,000 (< 30.4 chunks a channel, down to 128 KiB), then
    36,000 and 18,000 (< 7.6, down to 32 KiB), rounded to 1,920-byte grains: 17,280; loops
    ceil(4 MiB / (16 x 17,280)) = 16; 2 channels a GPU, so 32 posts a direction. 8 B by LL:
    one channel (8 < 2 x 512 x 8 bytes), one loop, one post."""
    from minipar.simulate import proxy

    assert proxy.tree_posts(4 << 20, "LL128", 4, 8, 8) == (16, 17280, 16, 32)
    assert proxy.tree_posts(1 << 20, "LL128", 2, 8, 8) == (16, 17280, 4, 8)
    assert proxy.tree_posts(8, "LL", 2, 8, 8) == (1, 32768, 1, 1)
    assert proxy.post_seconds(4 << 20, "LL128", 4, 8, 8, pieces=16) == pytest.approx(2e-6)
    assert proxy.post_seconds(4 << 20, "LL128", 1, 8, 8, pieces=16) == 0.0, "one node"
    assert proxy.post_seconds(8, "LL", 4, 8, 8, pieces=1) == 0.0, "one chunk: the tuner's hop"


def test_nccls_tuner_caps_a_channels_rate_across_nodes():
    """NCCL 2.26.2 tuning.cc ncclTopoTuneModel, worked by hand for 8 x 8 H100 at 64 MiB: the
    graph has 8 channels (a NIC each); on more than 2 nodes a channel carries at most 36.0
    GB/s by the tree, 29.0 by the tree's LL128, 36.7 by the ring's LL128. Tree LL128: 8 x
    29.0 = 232 GB/s bus, half of it algbw, x 0.9 (treeCorrectionFactor, LL128, 2^20 x 64 B);
    the three best pairs within 1%, the tree's LL128 the cheapest (NCCL's own pick)."""
    n, p = 64 * MiB, 64
    tree_ll128 = (14.0 + 2 * (7 * 1.25 + 3 * 8.5)) * US + n / (8 * 29.0e9 * 0.5 * 0.9)
    tree_simple = (8.4 + 2 * (7 * 4.0 + 3 * 14.0)) * US + n / (8 * 36.0e9 * 0.5 * 0.8)
    ring_ll128 = (14.0 + 112 * 1.9 + 14 * 4.0) * US + n * 126 / (64 * 8 * 36.7e9)
    assert nccl_time("all_reduce", "double_tree", "LL128", n, p, H100) == pytest.approx(tree_ll128)
    assert nccl_time("all_reduce", "double_tree", "Simple", n, p, H100) == pytest.approx(
        tree_simple
    )
    assert nccl_time("all_reduce", "ring", "LL128", n, p, H100) == pytest.approx(ring_ll128)
    assert tree_ll128 == pytest.approx(725.3 * US, abs=0.1 * US)
    assert choose("all_reduce", n, p, H100) == ("double_tree", "LL128")
    # one node: no network channel to cap (the ring's LL128 at 0.92 of NVLink, as before)
    one = nccl_time("all_gather", "ring", "LL128", GiB, 8, H100)
    assert one == pytest.approx((14.0 + 7 * 1.9) * US + GiB * 7 / (8 * 0.92 * NVLINK))


def test_nccls_multi_node_simple_ring_pays_its_plateau():
    """ncclTopoGetAlgoTime: the Simple ring's all-reduce latency across nodes x 1.4 once
    bytes / (channels x ranks) >= 64, channels 16 (2 a NIC): on 2 x 8 from 16 KiB."""
    p, lat = 16, (8.4 + 28 * 3.4 + 2 * 14.0) * US  # 28 intra steps at max(3.4, 3 x 1 us)
    at = 16 << 10  # 16,384 / (16 x 16) = 64 bytes
    bus = 400e9  # min(NVLink x 8/7, 8 NICs x 50 GB/s)
    assert nccl_time("all_reduce", "ring", "Simple", at, p, H100) == pytest.approx(
        1.4 * lat + at * 30 / (p * bus)
    )
    below = at - 4
    assert nccl_time("all_reduce", "ring", "Simple", below, p, H100) == pytest.approx(
        lat + below * 30 / (p * bus)
    )
    # one node: never
    assert nccl_time("all_reduce", "ring", "Simple", GiB, 8, H100) == pytest.approx(
        (8.4 + 14 * 3.4) * US + GiB * 14 / (8 * NVLINK)
    )


def test_nccls_tuner_prices_nvls_tree_across_nodes_by_its_own_formula():
    """NVLSTree is not simulated; NCCL's tuner's figure for it is (tuning.cc), worked by hand:
    2.26.2 on 2 x 8 H100 at 16 MiB: 25 + 2 x 1 x 14 = 53 us, 8 heads x min(48, 48) GB/s x 5/6
    = 320 GB/s, 53 + 16,777,216 / 320e3 = 105.43 us; 2.30.7: 25 + 2 x 20.9 = 66.8 us, a
    channel min(48 x 0.85 x 7/8 x 2 = 71.4, 48 x 2, 57.7) = 57.7, 8 x 57.7 x 16/30 = 246.19
    GB/s, 66.8 + 68.148 = 134.948 us; 2.26.2 on 8 x 8 at 64 MiB: 25 + 2 x 3 x 14 = 109 us, 8 x
    48 / 2 x 5/6 = 160 GB/s, 109 + 419.43 = 528.43 us. One node, or no NVLink SHARP: none."""
    from minipar.simulate.nvls import tree_tuner_seconds

    assert tree_tuner_seconds(16 * MiB, 16, H100, "2.26") == pytest.approx(105.4288 * US)
    assert tree_tuner_seconds(16 * MiB, 16, H100, "2.30") == pytest.approx(134.9484 * US)
    assert tree_tuner_seconds(64 * MiB, 64, H100, "2.26") == pytest.approx(528.4304 * US)
    assert tree_tuner_seconds(16 * MiB, 8, H100) is None
    assert tree_tuner_seconds(16 * MiB, 16, clusters.preset("pcie")) is None
