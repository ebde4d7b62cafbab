"""The planner knows the nodes: every group priced at the link it spans, DDP vs full sharding vs
hybrid sharding's bytes across per node, and `minipar plan` showing where each group runs.
No ranks: the expected values are the formulas written out here, on links whose alpha and gamma
are zero so that a collective's seconds are its bytes sent times beta, DeviceMesh's own groups on
each fill's node map, and runs of `minipar train` on emulated nodes recorded as data
(tests/data/plan_runs_two_nodes.json, scripts/plan_against_runs.py).

Checks: minipar/planning/node_traffic.py, planner.py (its node terms), plan_table.py."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from minipar import cost
from minipar.cli import plan as plan_cli
from minipar.planning import node_traffic, plan_table
from minipar.planning.planner import CLUSTERS, ModelSpec, evaluate, plan_layouts, shared_cores

FAST = cost.Link("fast", alpha=0.0, beta=1e-9, gamma=0.0)  # 1 GB/s
SLOW = cost.Link("slow", alpha=0.0, beta=4e-8, gamma=0.0)  # 25 MB/s (200 Mbit/s)
TWO_A_NODE = replace(CLUSTERS["cpu"], hierarchy=cost.Hierarchy(FAST, SLOW, 2))
# the tiny GPT a colleague measured on 2 emulated nodes x 2 ranks: 2 layers, hidden 256
TINY = ModelSpec(2, 256, 4, seq_len=64, global_batch=8, vocab=256, dropout=False)


def test_a_group_spans_ceil_g_over_k_nodes():
    for g, k, nodes in ((1, 8, 1), (8, 8, 1), (9, 8, 2), (16, 8, 2), (17, 8, 3), (3, 2, 2)):
        assert node_traffic.spanned(g, 1, k) == nodes == math.ceil(g / k)
    # dp ranks tp = 2 apart on nodes of 8: 4 of them in a node
    assert node_traffic.spanned(16, 2, 8) == 4
    where = node_traffic.placement(dp=4, tp=4, pp=2, cp=1, ep=1, per_node=8)
    assert where == {"tp": 1, "dp": 2, "pp": 2}  # tp in a node; dp 4 apart: 2 a node


def test_tp_across_nodes_is_priced_at_the_inter_node_link():
    h100 = CLUSTERS["dgx-h100"]
    m = ModelSpec.preset("7b", seq_len=2048, global_batch=16)
    act = 1 * m.seq_len * m.hidden * 2  # one micro-batch's activations, bf16
    calls = (4 * m.layers + 2) * 16  # 4 all-reduces a layer, the embedding's, the head's; m 16
    for tp, link in ((8, cost.NVLINK4), (16, cost.IB_NDR)):
        lay = evaluate(m, h100, 1, tp, 1, 1, tp_across_nodes=True)
        ring = 2 * (tp - 1) * link.alpha + 2 * (tp - 1) / tp * act * link.beta
        ring += (tp - 1) / tp * act * link.gamma  # the ring's reductions
        assert lay.time["tp_comm"] == pytest.approx(calls * ring, rel=1e-3)
        assert lay.nodes["tp"] == math.ceil(tp / 8)
    # across: one crossing hop out of each node, 2 (tp-1)/tp of the activations per call
    assert lay.across_bytes == pytest.approx(calls * 2 * 15 / 16 * act)


def test_ddp_full_and_hybrid_bytes_across_per_node():
    psi = 1000.0
    ddp, full = (node_traffic.sharding_bytes(psi, 4, 2, mode) for mode in ("ddp", "full"))
    hybrid = node_traffic.sharding_bytes(psi, 4, 2, "hybrid", 2)
    # p = 4 ranks on n = 2 nodes of k = 2; hybrid: s = 2 inside, r = 2 across
    assert ddp["across"] == pytest.approx(2 * (2 - 1) / 2 * psi)  # two-level: 2(n-1)/n Psi
    assert full["across"] == pytest.approx(3 * (4 - 1) / 4 * psi)  # 3 rings, one hop out a node
    assert hybrid["across"] == pytest.approx(2 * 2 * (2 - 1) / 2 * psi / 2)  # s x 2(r-1)/r Psi/s
    assert hybrid["inside"] == pytest.approx(2 * (2 - 1) / 2 * psi + (2 - 1) / 2 * psi)
    # 8 ranks on 2 nodes of 4, shard inside the node: full 3 x 7/8, hybrid 2 x 1/2
    assert node_traffic.sharding_bytes(psi, 8, 4, "full")["across"] == pytest.approx(2.625 * psi)
    assert node_traffic.sharding_bytes(psi, 8, 4, "hybrid", 4)["across"] == pytest.approx(psi)
    # 6 ranks on nodes of 4 (not a multiple): DDP's flat ring, 2(p-1)/p Psi across
    assert node_traffic.sharding_bytes(psi, 6, 4, "ddp")["across"] == pytest.approx(10 / 6 * psi)
    assert node_traffic.sharding_bytes(psi, 2, 2, "full") == {"inside": 1.5 * psi, "across": 0.0}


def test_hybrid_layout_prices_gathers_inside_and_one_all_reduce_across():
    psi = TINY.params * 4  # fp32 gradients, no tp or pp
    full = evaluate(TINY, TWO_A_NODE, 4, 1, 1, 2, zero=3)
    hybrid = evaluate(TINY, TWO_A_NODE, 4, 1, 1, 2, zero=3, dp_shard=2)
    ddp = evaluate(TINY, TWO_A_NODE, 4, 1, 1, 2, zero=0)
    assert (full.dp_mode, hybrid.dp_mode, ddp.dp_mode) == ("full", "hybrid", "ddp")
    # minipar's FSDP (the cpu preset's minipar_collectives) takes the two-level all-gathers and
    # reduce-scatter across nodes: each puts (n-1)/n Psi out of a node, 3 (n-1)/n Psi in all;
    # NCCL's rings (minipar_collectives=False): 3 (p-1)/p Psi, one hop out of each node
    assert full.across_bytes == pytest.approx(3 * 1 / 2 * psi)
    rings = replace(TWO_A_NODE, minipar_collectives=False)
    assert evaluate(TINY, rings, 4, 1, 1, 2, zero=3).across_bytes == pytest.approx(3 * 3 / 4 * psi)
    assert hybrid.across_bytes == pytest.approx(2 * 1 / 2 * psi)
    # DDP's two-level all-reduce (minipar's across nodes, as NCCL's): 2 (n-1)/n Psi = Psi
    assert ddp.across_bytes == pytest.approx(2 * 1 / 2 * psi)
    assert evaluate(TINY, rings, 4, 1, 1, 2).across_bytes == pytest.approx(psi)
    # full: 3 rings over a node's 2 ranks at the fast link, then 3 over the 2 nodes of half the
    # vector at the slow one; hybrid: 3 rings over 2 at the fast one, then an all-reduce of
    # Psi/2 over 2 ranks at the slow one
    inside, across = 3 * 1 / 2 * psi * FAST.beta, 3 * 1 / 2 * (psi / 2) * SLOW.beta
    assert full.time["dp_total"] == pytest.approx(inside + across)
    ring = evaluate(TINY, rings, 4, 1, 1, 2, zero=3)
    assert ring.time["dp_total"] == pytest.approx(3 * 3 / 4 * psi * SLOW.beta)
    inside, across = 3 * 1 / 2 * psi * FAST.beta, 2 * 1 / 2 * (psi / 2) * SLOW.beta
    assert hybrid.time["dp_total"] == pytest.approx(inside + across)
    # states sharded over the 2 ranks of the shard group, not the 4 of dp
    assert hybrid.memory["optimizer"] == pytest.approx(2 * full.memory["optimizer"])


def test_plan_table_shows_where_and_what_crosses():
    from rich.console import Console

    layouts = plan_layouts(TINY, TWO_A_NODE, gpus=4, zero=3, dp_shard=2, micro_batches=[1])
    assert {lay.dp for lay in layouts} == {2, 4}  # dp = 1 cannot hold a shard group of 2
    console = Console(record=True, width=200)
    console.print(plan_table.table(layouts, TINY, TWO_A_NODE, 4, top=10))
    text = console.export_text()
    assert "hybrid sharding" in text
    rows = {lay.dp: lay for lay in layouts if lay.tp == 1 and lay.pp == 1}
    line = next(
        row for row in text.splitlines() if row.split()[:3] in (["★", "4", "1"], ["4", "1", "1"])
    )
    assert "dp 2n" in line and plan_table.short_bytes(rows[4].across_bytes) in line
    tp2 = next(row for row in text.splitlines() if row.split()[:3] == ["2", "2", "1"])
    assert "tp 1n" not in tp2 and "tp in" in tp2 and "dp 2n" in tp2


def test_plan_refuses_a_bad_dp_shard(capsys):
    parser = argparse.ArgumentParser()
    plan_cli.configure(parser)
    for argv, said in (
        (["--dp-shard", "2"], "needs zero=3 (--zero 3), got 0"),
        (["--zero", "3", "--dp-shard", "0"], None),  # 0: shard over all dp
        (["--zero", "3", "--dp-shard", "-1"], "dp_shard=-1 (--dp-shard)"),
    ):
        args = parser.parse_args(["--model", "tiny", "--cluster", "cpu", "--gpus", "4", *argv])
        rc = plan_cli.main(args)
        err = capsys.readouterr().err
        assert (rc, said is None or said in err) == (0 if said is None else 2, True), err


def node_maps(size: int, per_node: int) -> dict:
    """{fill: node of each rank} as minipar run --fill lays `size` ranks on nodes of per_node."""
    nodes = math.ceil(size / per_node)
    return {
        "block": [r // per_node for r in range(size)],
        "cyclic": [r % nodes for r in range(size)],
    }


def test_spans_and_senders_under_both_fills_against_the_mesh_groups():
    """spanned's min(g, N / gcd(stride, N)) (cyclic) and ceil(g / (k/stride)) (block), and
    senders (ranks of a node whose ring hop, every group of the axis round in rank order at
    once, leaves it), against MeshShape's real groups laid on each fill's node map. Groups that
    straddle nodes unevenly (tp = 3 on nodes of 2) are outside the formulas and not tried."""
    from minipar.parallel.mesh import MeshShape

    shapes = (
        (2, 2, 2, 1, 1),
        (4, 2, 1, 1, 2),
        (2, 4, 1, 2, 1),
        (8, 1, 2, 1, 4),
        (4, 1, 1, 1, 1),
        (2, 2, 1, 1, 1),
        (1, 2, 2, 1, 1),
        (2, 1, 1, 2, 1),
        (3, 2, 1, 1, 1),
        (2, 2, 2, 2, 1),
    )
    checked = 0
    for dp, tp, pp, cp, ep in shapes:
        shape = MeshShape(dp, tp, pp, cp, ep)
        for per_node in (2, 4, 8):
            for fill, node_of in node_maps(shape.size, per_node).items():
                if fill == "cyclic" and shape.size % per_node:
                    continue  # cyclic fill deals whole nodes' worth
                spans = node_traffic.placement(dp, tp, pp, cp, ep, per_node, fill)
                n = math.ceil(shape.size / per_node)
                for axis, (size, stride) in node_traffic.strides(dp, tp, pp, cp, ep).items():
                    if size == 1:
                        continue
                    groups = shape.all_groups(axis)
                    on = [len({node_of[r] for r in g}) for g in groups]
                    assert spans[axis] == max(on), (shape, per_node, fill, axis)
                    out = [0] * n  # ring hops leaving each node, all groups at once
                    for g in groups:
                        for a, b in zip(g, g[1:] + g[:1], strict=True):
                            out[node_of[a]] += node_of[a] != node_of[b]
                    said = node_traffic.senders(size, stride, per_node, fill, n)
                    assert said == max(out), (shape, per_node, fill, axis, out)
                    checked += 1
    assert checked > 100


def test_cyclic_fill_swaps_which_axes_cross():
    """2 nodes of 2, rank r on node r mod 2: a tp pair (ranks 0, 1) crosses, a dp pair tp = 2
    apart (0, 2) stays inside; a pipeline over dp x tp = 2 apart stays inside too."""
    assert node_traffic.placement(2, 2, 1, 1, 1, 2, "cyclic") == {"tp": 2, "dp": 1}
    assert node_traffic.placement(2, 2, 1, 1, 1, 2, "block") == {"tp": 1, "dp": 2}
    assert node_traffic.placement(2, 1, 2, 1, 1, 2, "cyclic") == {"dp": 2, "pp": 1}
    # min(g, N / gcd(stride, N)): 8 nodes, a group of 4 ranks 2 apart lies on 4 of them,
    # 4 apart on 2, 8 apart on 1
    assert [node_traffic.spanned(4, d, 1, "cyclic", 8) for d in (1, 2, 4, 8)] == [4, 4, 2, 1]
    lay = evaluate(TINY, TWO_A_NODE, 2, 2, 1, 4, fill="cyclic", tp_across_nodes=True)
    assert lay.nodes == {"tp": 2, "dp": 1} and lay.fill == "cyclic"
    psi = TINY.params / 2 * 4  # a tp rank's fp32 gradients: dp inside, nothing of it crosses
    assert lay.time["dp_total"] == pytest.approx(2 * 1 / 2 * psi * FAST.beta, rel=0.02)


def test_cyclic_dp_rings_cross_at_every_hop():
    """dp = 4 on 2 nodes of 2 dealt round (nodes 0 1 0 1): the flat ring's every hop crosses,
    both ranks of a node send at once: 2 x 3(p-1)/p Psi of full sharding's rings leave a node
    (block: 1 x), and on one link a node (nics 1) each byte takes twice its time."""
    psi = 1000.0
    where = node_traffic.Where(2, 1, "cyclic", 2)
    full = node_traffic.sharding_bytes(psi, 4, 2, "full", 0, where)
    assert full == {"inside": 0.0, "across": pytest.approx(2 * 3 * 3 / 4 * psi)}
    # hybrid, shard pairs (0, 1) (2, 3) across, copies (0, 2) (1, 3) inside a node
    hybrid = node_traffic.sharding_bytes(psi, 4, 2, "hybrid", 2, where)
    assert hybrid["across"] == pytest.approx(2 * 3 * 1 / 2 * psi)
    assert hybrid["inside"] == pytest.approx(2 * 1 / 2 * psi / 2)
    h = TWO_A_NODE.hierarchy
    t = node_traffic.sharding_time(psi, 4, 2, "full", 0, h, nics=1, where=where)
    assert t == pytest.approx(3 * 3 / 4 * psi * 2 * SLOW.beta)  # shared by 2 senders


def test_plan_refuses_a_bad_fill(capsys):
    parser = argparse.ArgumentParser()
    plan_cli.configure(parser)
    args = parser.parse_args(["--model", "7b", "--nodes", "2", "--fill", "diagonal"])
    assert plan_cli.main(args) == 2
    assert "fill='diagonal' (--fill) must be one of block, cyclic" in capsys.readouterr().err
    with pytest.raises(ValueError, match="fill='round'"):
        evaluate(TINY, TWO_A_NODE, 4, 1, 1, 2, fill="round")
    # a good one: the layouts priced dealt round, and the best's axes placed so
    args = parser.parse_args(["--model", "7b", "--nodes", "2", "--fill", "cyclic", "--json"])
    assert plan_cli.main(args) == 0
    layouts = json.loads(capsys.readouterr().out)["layouts"]
    assert {lay["fill"] for lay in layouts} == {"cyclic"}
    tp8 = next(lay for lay in layouts if lay["tp"] == 8)
    assert tp8["nodes"]["tp"] == 2  # 8 consecutive ranks dealt over 2 nodes: tp crosses
    best = evaluate(ModelSpec.preset("7b"), CLUSTERS["dgx-h100"], 2, 1, 8, 1, fill="cyclic")
    said = plan_cli.placement(best, 8)
    assert "dealt round" in said and "pp inside a node" in said and "dp across nodes" in said


def test_plan_prices_the_nodes_minipar_run_makes(capsys):
    """`minipar plan --per-node 2 --link 200mbit`: the cluster of `minipar run --nodes 2 -n 4
    --link 200mbit`, 2 ranks a node, one 25 MB/s cable a node that their crossing messages
    share. Hybrid sharding (shard 2 in a node, 2 copies) sends one all-reduce of each rank's
    half across: 2 (r-1)/r Psi/2 from each of a node's 2 ranks = Psi (fp32) out of a node;
    full sharding, two-level, 3 (n-1)/n Psi = 1.5 Psi. Bad values are named."""
    parser = argparse.ArgumentParser()
    plan_cli.configure(parser)
    common = ["--model", "tiny", "--cluster", "cpu", "--gpus", "4", "--per-node", "2",
              "--link", "200mbit", "--zero", "3", "--json"]  # fmt: skip
    across = {}
    for mode, extra in (("hybrid", ["--dp-shard", "2"]), ("full", [])):
        assert plan_cli.main(parser.parse_args(common + extra)) == 0
        layouts = json.loads(capsys.readouterr().out)["layouts"]
        dp4 = next(lay for lay in layouts if (lay["dp"], lay["tp"], lay["pp"]) == (4, 1, 1))
        assert dp4["nodes"] == {"dp": 2}, dp4["nodes"]
        across[mode] = dp4["across_bytes"]
    psi = 4 * ModelSpec.preset("tiny").params
    assert across == {"hybrid": pytest.approx(psi), "full": pytest.approx(1.5 * psi)}
    cluster, gpus = plan_cli.cluster_from_args(parser.parse_args(common))
    assert (gpus, cluster.nics_per_node, cluster.hierarchy.per_node) == (4, 1, 2)
    assert cluster.hierarchy.inter.beta == pytest.approx(8 / 200e6)
    for bad, said in ((["--per-node", "0"], "per_node=0 (--per-node)"),
                      (["--link", "2gbps"], "'2gbps'")):  # fmt: skip
        assert plan_cli.main(parser.parse_args(common + bad)) == 2
        assert said in capsys.readouterr().err


def test_spans_agree_with_the_mesh_groups():
    """node_traffic's ceil(g / (k/stride)) against DeviceMesh's real groups (MeshShape builds
    every group's ranks): inside a node exactly when it spans one."""
    from minipar.parallel.mesh import MeshShape

    for dp, tp, pp, cp, ep in ((2, 2, 2, 1, 1), (4, 2, 1, 1, 2), (2, 4, 1, 2, 1), (8, 1, 2, 1, 4)):
        for per_node in (2, 4, 8):
            shape = MeshShape(dp, tp, pp, cp, ep)
            spans = node_traffic.placement(dp, tp, pp, cp, ep, per_node)
            for axis, word in shape.placement(per_node).items():
                if axis in spans:
                    assert (spans[axis] == 1) == (word == "inside a node"), (shape, per_node, axis)


RUNS = Path(__file__).parent / "data" / "plan_runs_two_nodes.json"


LINK_EFFICIENCY = 0.93  # of the shaped rate TCP reached across the link (docs/cluster.md)


def emulated_nodes(
    bits_per_s: float,
    dense_step: float = 0.0,
    cores_left: float = 2.0,
    steps: dict | None = None,
):
    """The "cpu" preset as 2 emulated nodes x 2 ranks on a 2-core machine see it: one veth a node
    at the link's rate (alpha 50 us, a byte reduced at 5 GB/s; calibrated: at the 93% of it TCP
    reached, docs/cluster.md), the 4 ranks sharing the cores other jobs left them (`cores_left`,
    as measured during the run; core_share = cores_left / 4, at most 1), each at a rate
    calibrated so that the planner's dense step of the model on one process takes `dense_step`
    CPU seconds (as measured; 0: the preset's assumed 10 GFLOP/s). `steps`: what
    minipar.bench.step_latency measured with 4 ranks computing on the 2 cores at a `share` of a
    core each: the seconds of a message-step (`alpha`) and of a byte within one (`beta`), taken
    as planner.calibrated_cpu takes them (every message-step on the critical path waits alpha;
    no message between nodes moves a byte faster than beta) and scaled by share / core_share: a
    rank waits for its peer's turn, and a large message crosses in turns, as long as the other
    ranks' time slices last, the longer the fewer cores are left. Inside a node the preset's
    shared memory: the gathers and reductions that stay in a node run in its shared window (a
    floor of beta there priced hybrid sharding's gathers 1.5x the measured step)."""
    share = min(1.0, max(cores_left, 0.1) / 4)
    steps = steps or {"alpha": 0.0, "beta": 0.0, "share": share}
    slower = steps["share"] / share
    beta = 8 / (bits_per_s * (LINK_EFFICIENCY if dense_step else 1.0))
    beta_min = steps["beta"] * slower
    link = cost.Link(f"{bits_per_s / 1e6:g} Mbit/s", alpha=50e-6, beta=max(beta, beta_min),
                     gamma=2e-10)  # fmt: skip
    intra = cost.SHARED_MEMORY
    cpu = replace(CLUSTERS["cpu"], hierarchy=cost.Hierarchy(intra, link, 2))
    if dense_step:
        cpu = replace(cpu, peak_flops=calibrated_rate(cpu, dense_step))
    wait = max(0.0, steps["alpha"] - intra.alpha) * slower
    cluster = shared_cores(cpu, 4, 2, share=share)
    return replace(cluster, nics_per_node=1, core_share=share, step_wait=wait)


def calibrated_rate(cpu, dense_step: float, model: ModelSpec = TINY) -> float:
    """The peak rate at which one process's dense step of `model` (one micro-batch, the cpu
    preset's per-op cost) takes `dense_step` seconds: rate = FLOPs / (step - ops x op cost)."""
    dense = evaluate(model, cpu, 1, 1, 1, model.global_batch)
    ops_seconds = dense.time["compute"] - model.train_flops() / (cpu.peak_flops * cpu.efficiency)
    return model.train_flops() / cpu.efficiency / max(dense_step - ops_seconds, 0.05 * dense_step)


def predicted_step(run: dict, calibration: dict | None = None) -> float:
    """The planner's step for one recorded run (scripts/plan_against_runs.py): its mesh, FSDP
    (zero 3) or hybrid sharding, MoE, fill and link rate, the tiny GPT above, on the cores the
    run had (2 less what other jobs used meanwhile), with the recorded calibration (the dense
    step's CPU seconds, the message-step's; None: the preset's assumptions)."""
    mesh, args = run["mesh"], run["train_args"]
    model = replace(TINY, experts=4, top_k=2) if "--moe" in args else TINY
    hybrid = "--dp-shard" in args
    shard = int(args[args.index("--dp-shard") + 1]) if hybrid else 0
    zero = 3 if hybrid or "--fsdp" in args else 0
    micro = model.global_batch // (mesh["dp"] * mesh["microbatches"])
    dense = calibration["dense_step_cpu_s"]["1"] if calibration else 0.0
    steps = calibration["step_latency_4"] if calibration else None
    cluster = emulated_nodes(run["link_bits_per_s"], dense, 2 - run["others_cores"], steps)
    lay = evaluate(
        model, cluster, mesh["dp"], mesh["tp"], mesh["pp"], micro,
        zero=zero, cp=mesh["cp"], ep=mesh["ep"], dp_shard=shard, fill=run["fill"],
    )  # fmt: skip
    return lay.step_time


def recorded(path=RUNS) -> list[tuple[dict, dict]]:
    """(run, its calibration) for every run of tests/data/plan_runs_two_nodes.json: the
    calibration of the session that took the run (before the runs, else after them)."""
    data = json.loads(Path(path).read_text())
    sessions = {k: c.get("before") or c["after"] for k, c in data["calibration"].items()}
    return [(run, sessions[run["calibration"]]) for run in data["runs"]]


def test_the_planner_within_25_percent_of_every_recorded_run():
    """Issue 58's goal: the planner's step within 25% of the measured median on every layout
    `minipar train` runs on 2 emulated nodes x 2 ranks (4 ranks: dp, tp, pp, cp, FSDP, hybrid
    sharding, experts), --fill block and cyclic, at 200 Mbit/s and 2 Gbit/s. A record that
    misses for a measured cause says so (`miss`) and is listed, not judged."""
    runs = recorded()
    assert {(r["fill"], r["link"]) for r, _ in runs} == {
        (f, link) for f in ("block", "cyclic") for link in ("200mbit", "2gbit")
    }
    assert len({r["layout"] for r, _ in runs}) >= 8
    off = []
    for run, calibration in runs:
        ratio = predicted_step(run, calibration) / run["median"]
        if "miss" in run:
            assert run["miss"]["cause"], run["layout"]
            continue
        if abs(ratio - 1) > 0.25:
            off.append(f"{run['link']} {run['fill']} {run['layout']}: {ratio:.2f}")
    assert not off, off


def test_a_bubble_hidden_when_one_stage_fills_the_cores():
    """4 ranks on 2 cores (half a core each), pp = 2: the ranks of one stage alone fill the
    cores, so a stage waiting in the fill or drain (or for its neighbour's hop) idles no core:
    no bubble, no pipeline waits. pp = 4 on 2 cores of 8 ranks' shares (1/4 each) hides it too;
    pp = 4 at half a core each does not: (p-1)/m of the compute at a whole core's speed."""
    half = replace(emulated_nodes(2e9), step_wait=1e-3)
    two = evaluate(TINY, half, 2, 1, 2, 2)
    link, act = half.hierarchy.inter, 2 * 64 * 256 * 4  # a micro-batch of 2, fp32
    # 2 (m + p - 1) hops, both ranks of a stage crossing the one veth at once; no waits
    hops = 2 * (2 + 2 - 1) * (link.alpha + 2 * act * link.beta)
    assert two.time["bubble"] == 0 and two.time["pp_comm"] == pytest.approx(hops)
    four = evaluate(TINY, half, 1, 1, 4, 2)  # 4 micro-batches of 2
    assert four.time["bubble"] == pytest.approx(four.time["compute"] * 0.5 * 3 / 4)
    quarter = replace(half, core_share=0.25)
    assert evaluate(TINY, quarter, 1, 1, 4, 2).time["bubble"] == 0


def test_two_level_sharding_on_three_nodes_of_two():
    """3 nodes of k = 2 dp ranks (p = 6; n and k differ, so (n-1)/n and (k-1)/k cannot stand in
    for each other), one cable a node shared by its 2 crossing ranks, links with alpha = gamma
    = 0: minipar's collectives two-level, the formulas of node_traffic's docstring written out."""
    psi, n, k = 1200.0, 3, 2
    where = node_traffic.Where(k, 1, "block", n)

    def traffic(mode, shard=0, minipar=True):
        return node_traffic.sharding_bytes(psi, n * k, k, mode, shard, where, minipar)

    assert traffic("ddp") == pytest.approx({"inside": psi, "across": 2 * 2 / 3 * psi})
    assert traffic("full") == pytest.approx({"inside": 1.5 * psi, "across": 3 * 2 / 3 * psi})
    # NCCL's rings: one hop out of each node, 3 (p-1)/p Psi
    assert traffic("full", minipar=False)["across"] == pytest.approx(3 * 5 / 6 * psi)
    # hybrid, a shard pair in each node, 3 copies: each rank 2 (r-1)/r of its half across
    assert traffic("hybrid", 2) == pytest.approx({"inside": 1.5 * psi, "across": 4 / 3 * psi})
    h = cost.Hierarchy(FAST, SLOW, k)
    full = node_traffic.sharding_time(psi, n * k, k, "full", 0, h, 1, where, minipar=True)
    # inside: 3 rings over 2 of Psi (Psi/2 sent each); across: 3 rings over the 3 nodes of the
    # node's 2 halves at once (Psi, 2/3 of it sent each), on the one shared cable
    assert full == pytest.approx(3 * psi / 2 * FAST.beta + 3 * 2 / 3 * psi * SLOW.beta)


# -- rules that change the answer only on some shapes (issue 72's planted bugs) -----------------


def test_a_nodes_links_are_shared_ceil_senders_over_nics():
    """3 crossing ranks on 2 NICs: one NIC carries 2 of them (ceil), so each byte costs twice
    its time; a floor would say 1 and price the node's link as if nothing shared it."""
    for count, nics, share in ((3, 2, 2), (4, 2, 2), (5, 2, 3), (1, 4, 1), (8, 8, 1), (7, 0, 1)):
        assert node_traffic.link_share(count, nics) == share, (count, nics)


def test_ranks_that_do_not_fill_their_last_node_still_count_it():
    """12 ranks on nodes of 8 are 2 nodes; dealt round (cyclic), rank r on node r mod 2: a tp
    pair {0, 1} spans both, a dp group {0, 2, ..., 10} (2 apart) sits on node 0 alone."""
    assert [node_traffic.n_nodes(g, 8) for g in (1, 8, 9, 12, 16, 17)] == [1, 1, 2, 2, 2, 3]
    where = node_traffic.placement(dp=6, tp=2, pp=1, cp=1, ep=1, per_node=8, fill="cyclic")
    assert where == {"tp": 2, "dp": 1}


def test_every_rank_of_a_pipeline_stage_sends_across_the_node_boundary():
    """dp 2 x tp 2 x pp 2 on 2 nodes of 4 (block): stage 0 is node 0, stage 1 node 1, tp and
    dp inside a node; each of a node's 4 ranks sends its activations (and takes their
    gradients back) for each of the m = 4 micro-batches: 4 x 2 x 4 x b s h bytes a node."""
    four = replace(CLUSTERS["cpu"], hierarchy=cost.Hierarchy(FAST, SLOW, 4))
    lay = evaluate(TINY, four, 2, 2, 2, 1)
    assert lay.nodes == {"tp": 1, "dp": 1, "pp": 2} and lay.microbatches == 4
    act = 1 * TINY.seq_len * TINY.hidden * 4  # fp32 on the cpu preset
    assert lay.across_bytes == pytest.approx(4 * 2 * 4 * act)
