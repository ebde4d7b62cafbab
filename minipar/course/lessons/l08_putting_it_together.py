"""Lesson 08: putting it together, DP x TP x PP (text: lessons/08_putting_it_together.md).

    minipar lesson 08 -n 8                 # minipar.course.lessons.l08_putting_it_together
    minipar lesson 08 -n 8 --quick

The ranks are laid on a DeviceMesh (tp innermost, then dp, then pp) and the mesh is drawn. Then
each group carries the traffic one training step of the tiny GPT gives it, at the tiny GPT's
real sizes: an all-reduce of activations on tp_group, the gradient all-reduce on dp_group,
activations sent from stage to stage on pp_group; the trace ledger counts the bytes and they are
checked against the formulas. The same traffic for a 7B model on two 8-GPU nodes is priced on
NVLink and on InfiniBand, which is why TP stays inside a node and PP goes across. Last, the
planner's table for this machine and for a cluster.

The end (not with --quick) trains the tiny GPT on the lesson's own mesh, checks its losses
against the dense run and sets its step time beside the planner's; then one step with each
recomputation policy (none, selective, full): the same loss, the bytes autograd kept per block
against minipar's formula (models/memory.py), the step time, and a trace of every rank
(comm/trace/chrome_trace.py) to open in Perfetto.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np

import minipar
from minipar import cost, launcher
from minipar.course import claims as C
from minipar.course.lessons.l04_topology_bandwidth import measured_link
from minipar.course.lessons.page import Page, fmt_bytes, fmt_time
from minipar.course.machine import link_bits
from minipar.launcher.cluster import link as wires
from minipar.models import memory, training
from minipar.parallel.mesh import TRAFFIC, DeviceMesh, render
from minipar.planning import plan_table, planner

TINY = planner.MODELS["tiny"]  # minipar train's default GPT: 8 layers, hidden 64, seq 64
VALUE_BYTES = 4  # float32 on CPU


def default_layout(size: int) -> tuple[int, int, int]:
    """(dp, tp, pp) for `size` ranks: tp=2 and pp=2 where they divide, dp the rest."""
    tp = 2 if size % 2 == 0 else 1
    pp = 2 if (size // tp) % 2 == 0 else 1
    return size // (tp * pp), tp, pp


def step_traffic(dp: int, tp: int, pp: int, microbatches: int) -> dict:
    """What one step of the tiny GPT sends on each group: (bytes per call, calls per step).

    tp: 4 all-reduces of a micro-batch's activations (b s h values) per layer (2 forward,
    2 backward), for the L/pp layers of this stage and each of the m micro-batches; dp: one
    all-reduce of this rank's gradients (params / (tp pp)); pp: a micro-batch's activations
    forward and their gradient backward, m times each."""
    micro = TINY.global_batch // dp // microbatches
    act = micro * TINY.seq_len * TINY.hidden * VALUE_BYTES
    grads = TINY.params // (tp * pp) * VALUE_BYTES
    return {
        "tp": (act, 4 * TINY.layers // pp * microbatches if tp > 1 else 0),
        "dp": (grads, 1 if dp > 1 else 0),
        "pp": (act, 2 * microbatches if pp > 1 else 0),
    }


def mesh_section(page: Page, mesh: DeviceMesh) -> None:
    page.prediction(f"the mesh: {mesh.shape} on {page.size} ranks")
    page.console.print(render(mesh.shape, highlight=0))
    rows = [
        (axis, mesh.shape.degree(axis), str(mesh.shape.groups(axis)), TRAFFIC[axis])
        for axis in ("tp", "dp", "pp")
    ]
    page.table("Groups (ranks of each)", ["group", "size>", "groups", "what moves on it"], rows)


def traffic_section(page: Page, mesh: DeviceMesh, microbatches: int) -> None:
    """One call of each group's collective at the tiny GPT's sizes, traced; every rank's sums
    checked against the written-out grid."""
    page.measurement("one call on each group, traced (float32, the tiny GPT's sizes)")
    traffic = step_traffic(mesh.dp, mesh.tp, mesh.pp, microbatches)
    seen = {}
    for axis, group in (("tp", mesh.tp_group), ("dp", mesh.dp_group), ("pp", mesh.pp_group)):
        nbytes = traffic[axis][0]
        x = np.full(nbytes // VALUE_BYTES, float(page.rank), dtype=np.float32)
        with minipar.trace() as t:
            if axis == "pp":
                send_to_next_stage(mesh, x)
            else:
                minipar.all_reduce(x, group=group, algorithm="ring")
        want = float(sum(mesh.ranks(axis))) if axis != "pp" else expected_pp(mesh)
        seen[axis] = (t.bytes_sent(), bool((x == want).all()))
    everyone = page.gather(seen)
    rows = []
    for axis in ("tp", "dp", "pp"):
        nbytes, calls = traffic[axis]
        p = mesh.shape.degree(axis)
        formula = 2 * (p - 1) / p * nbytes if axis != "pp" else (nbytes if p > 1 else 0)
        sent = max(r[axis][0] for r in everyone)
        rows.append(
            (
                axis,
                fmt_bytes(nbytes),
                fmt_bytes(sent),
                fmt_bytes(formula),
                calls,
                fmt_bytes(sent * calls),
            )
        )
        page.check(all(r[axis][1] for r in everyone), f"{axis}: every rank got its group's data")
        page.claim(f"{axis}: bytes sent match the formula", formula, sent, "B", C.absolute(16),
                   "bytes")  # fmt: skip
    page.table(
        None,
        ["group", "buffer>", "sent/rank>", "formula>", "calls/step>", "bytes/step>"],
        rows,
        caption=f"calls per step for {microbatches} micro-batch(es), 1F1B; ring: 2(p-1)/p n",
    )


def send_to_next_stage(mesh: DeviceMesh, x: np.ndarray) -> None:
    """Stage i sends its activations to stage i+1 (the last stage keeps its own)."""
    if mesh.next_stage is not None:
        mesh.pp_group.send(x, mesh.next_stage)
    if mesh.prev_stage is not None:
        mesh.pp_group.recv(x, mesh.prev_stage)


def expected_pp(mesh: DeviceMesh) -> float:
    """What x holds after the stage shift: the previous stage's rank, or our own on stage 0."""
    return float(mesh.rank - (mesh.dp * mesh.tp if mesh.prev_stage is not None else 0))


def placement_rows(model: planner.ModelSpec, micro: int = 1, microbatches: int = 8):
    """The tp and pp traffic of one step of `model` with tp=8 and pp=2, priced on NVLink 4 and
    on InfiniBand NDR: what each placement would cost."""
    act = micro * model.seq_len * model.hidden * 2
    tp_calls = 4 * model.layers // 2 * microbatches
    pp_calls = 2 * (microbatches + 2 - 1)
    rows = []
    for name, link in (
        ("NVLink 4 (inside a node)", cost.NVLINK4),
        ("IB NDR (across)", cost.IB_NDR),
    ):
        tp_time = tp_calls * cost.predict("all_reduce", "ring", act, 8, link)
        pp_time = pp_calls * (link.alpha + act * link.beta)
        rows.append((name, fmt_time(tp_time), fmt_time(pp_time)))
    return rows, act, tp_calls, pp_calls


def placement_section(page: Page) -> None:
    model = planner.MODELS["7b"]
    page.prediction("why TP inside the node and PP across (7B, 2 nodes of 8 H100, tp=8 pp=2)")
    rows, act, tp_calls, pp_calls = placement_rows(model)
    page.table(
        None,
        ["link", "tp traffic/step>", "pp traffic/step>"],
        rows,
        caption=f"tp: {tp_calls} all-reduces of {fmt_bytes(act)} on 8 ranks; "
        f"pp: {pp_calls} sends of {fmt_bytes(act)}",
    )
    page.say(
        f"TP's all-reduces sit on the critical path of every layer: over InfiniBand they would "
        f"cost {tp_ratio():.1f}x more per step, with nothing to hide behind. PP sends a few "
        "messages per micro-batch, point to point: it can afford the slower link."
    )


def tp_ratio() -> float:
    """How much more the 7B model's tp traffic costs over InfiniBand than over NVLink."""
    model = planner.MODELS["7b"]
    act = model.seq_len * model.hidden * 2  # one sequence's bf16 activations
    nv = cost.predict("all_reduce", "ring", act, 8, cost.NVLINK4)
    return cost.predict("all_reduce", "ring", act, 8, cost.IB_NDR) / nv


def claims() -> list[str]:
    """Numbers lessons/08_putting_it_together.md states; tests/test_lessons.py checks the text."""
    rows, act, tp_calls, pp_calls = placement_rows(planner.MODELS["7b"])
    return [
        *(cell for row in rows for cell in row[1:]),
        f"{tp_calls} all-reduces of {fmt_bytes(act)}",
        f"{pp_calls} sends",
        f"{tp_ratio():.1f}x",
        f"{TINY.params:,}",
        f"{planner.MODELS['7b'].params / 1e9:.2f}B",
    ]


def planner_section(page: Page) -> None:
    page.prediction(f"the planner: the tiny GPT on {page.size} ranks of this machine")
    cpu = planner.CLUSTERS["cpu"]
    layouts = planner.plan_layouts(TINY, cpu, page.size)
    page.console.print(plan_table.table(layouts, TINY, cpu, page.size, top=6))
    if not page.quick:
        model, h100 = planner.MODELS["7b"], planner.CLUSTERS["dgx-h100"]
        page.prediction("the planner: 7B on 2 nodes of 8 H100 (80 GB), ZeRO-1")
        big = planner.plan_layouts(model, h100, 16, zero=1)
        page.console.print(plan_table.table(big, model, h100, 16, top=6))
        chosen = planner.best(big)
        page.check(chosen is not None and chosen.tp <= 8, "the best 7B layout keeps TP in a node")
        sharding_across_nodes(page, model, h100)
        page.check(
            not any(lay.feasible for lay in planner.plan_layouts(model, h100, 8) if lay.dp == 8),
            "7B does not fit on 8 x 80 GB with pure data parallelism (16 bytes per parameter)",
        )


def sharding_across_nodes(page: Page, model, cluster) -> None:
    """ZeRO-3 over all 16 GPUs of 2 nodes against hybrid sharding (shard in a node, replicate
    across: lesson 05's section 5), priced by the planner on the preset's links."""
    page.prediction("the planner: 7B ZeRO-3 on 2 nodes of 8, full against hybrid sharding")
    rows, lays = [], {}
    for name, shard in (("full (over 16)", 0), ("hybrid (8 in a node, x2)", 8)):
        lay = lays[name] = planner.evaluate(model, cluster, 16, 1, 1, 1, zero=3, dp_shard=shard)
        rows.append((name, fmt_bytes(lay.across_bytes), fmt_bytes(lay.memory["optimizer"]),
                     fmt_time(lay.time["dp_total"]), fmt_time(lay.time["dp_comm"]),
                     fmt_time(lay.step_time)))  # fmt: skip
    page.table(
        None,
        ["sharding", "out of a node per step>", "optimizer per GPU>", "dp traffic>", "exposed>",
         "step>"],
        rows,
        caption="the planner hides data-parallel traffic behind 2/3 of the compute: with 256 "
        "sequences a step both hide, and the trade is bytes on InfiniBand against memory",
    )  # fmt: skip
    full, hybrid = lays.values()
    page.check(hybrid.across_bytes < full.across_bytes,
               "hybrid sharding sends fewer bytes between nodes than full sharding")  # fmt: skip


def measured_run_section(page: Page, mesh: DeviceMesh, microbatches: int) -> None:
    """Train the tiny GPT on the lesson's own mesh (tensor, pipeline and data parallel at once),
    check its losses against the dense run on one process, and put its step time beside the
    planner's prediction for the same layout."""
    layout = f"dp={mesh.dp} x tp={mesh.tp} x pp={mesh.pp}"
    page.measurement(f"the tiny GPT trained on the mesh: {layout}, {microbatches} micro-batches")
    if page.quick:
        page.say("Skipped with --quick (it loads torch on every rank): run without --quick.")
        return
    import statistics

    spec = training.RunSpec(mesh.dp, mesh.tp, mesh.pp, microbatches, "1f1b", steps=6)
    times = []
    losses, *_ = training.train_on_mesh(spec, mesh, lambda step, loss, t: times.append(t))
    # a step takes as long as its slowest rank
    measured = statistics.median(max(ts) for ts in zip(*page.gather(times[1:])))
    dense = training.train_dense(spec)[0] if page.rank == 0 else losses
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, dense))
    cpu = planner.shared_cores(
        planner.CLUSTERS["cpu"], page.size, launcher.cores(), planner.measure_flops()
    )
    micro = TINY.global_batch // mesh.dp // microbatches
    predicted = planner.evaluate(TINY, cpu, mesh.dp, mesh.tp, mesh.pp, micro).step_time
    page.table(
        None,
        ["layout", "loss first > last", "vs dense>", "predicted step>", "measured step>"],
        [
            (
                layout,
                f"{losses[0]:.3f} > {losses[-1]:.3f}",
                f"{worst:.1e}",
                fmt_time(predicted),
                fmt_time(measured),
            )
        ],
        caption="vs dense: the largest relative difference of a step's loss from the same run on "
        "one process; predicted: the planner on the 'cpu' cluster with this CPU's measured "
        "matmul rate shared by the ranks; measured: the median step (the first excluded)",
    )
    page.observe("measured step / predicted step", measured / predicted, "x")
    page.claim(f"{layout}: step time against the planner's", predicted, measured, "s",
               C.relative(0.5), basis="planner, 'cpu' cluster at this CPU's matmul rate",
               causes=["Python between the ops (20 us each in the planner) and the memory "
                       "traffic of small matrices, which the planner does not price"
                       if page.size <= launcher.cores() else ""])  # fmt: skip
    page.check(losses[-1] < losses[0], "the loss falls")
    page.check(worst <= 1e-4, "every step's loss equals the dense run's (float32, within 1e-4)")


def recompute_section(page: Page, mesh: DeviceMesh, microbatches: int) -> None:
    """One step of the tiny GPT per recomputation policy on the lesson's mesh, traced: the same
    loss, the bytes each block kept per micro-batch measured against the formula, the step
    time; the full run's trace written for Perfetto."""
    import os
    import tempfile

    layout = f"dp={mesh.dp} x tp={mesh.tp} x pp={mesh.pp}"
    page.measurement(f"recomputation on {layout}: one step each, memory and time")
    if page.quick:
        page.say("Skipped with --quick (it loads torch on every rank): run without --quick.")
        return
    micro = TINY.global_batch // mesh.dp // microbatches
    rows, losses = [], {}
    folder = tempfile.mkdtemp(prefix="minipar-l08-") if page.rank == 0 else None
    path = os.path.join(page.gather(folder)[0], "trace.json")
    for policy in ("none", "selective", "full"):
        spec = training.RunSpec(mesh.dp, mesh.tp, mesh.pp, microbatches, "1f1b", steps=2,
                                recompute=policy)  # fmt: skip
        times = []
        with minipar.trace() as t:
            t.align()
            step_losses, part, _ = training.train_on_mesh(
                spec, mesh, lambda step, loss, s, times=times: times.append(s)
            )
        if policy == "full":
            t.save(path)  # collective: rank 0 writes every rank's part
        kept = memory.per_layer(part.memory, microbatches)
        measured = page.gather(max(kept.values()) if kept else 0)
        slowest = max(ts[-1] for ts in page.gather(times))
        want = memory.layer_bytes(TINY_CONFIG, micro, mesh.tp, policy)
        losses[policy] = step_losses
        rows.append((policy, fmt_bytes(max(measured)), fmt_bytes(want), fmt_time(slowest)))
        page.claim(f"{policy}: bytes kept per block within 10% of the formula", want,
                   max(measured), "B", C.relative(0.1), "bytes")  # fmt: skip
    page.table(None, ["recompute", "kept per block>", "formula>", "second step>"], rows,
               caption=f"per block and micro-batch of {micro} sequences, float32; the formula: "
               "minipar/models/memory.py")  # fmt: skip
    page.check(losses["selective"] == losses["none"] == losses["full"],
               "the same loss with and without recomputation (bitwise)")  # fmt: skip
    if page.rank == 0:
        page.say(f"The full run's timeline: {path}, for ui.perfetto.dev (one process per rank).")


TINY_CONFIG = training.RunSpec().model  # minipar train's default GPT, as a GPTConfig


def tp_pairs(node_of) -> tuple[list[list[int]], list[list[int]]]:
    """Pairs of ranks for a tp group of 2: inside a node (the first two ranks of each node) and
    across nodes (the i-th rank of node 0 with the i-th of node 1)."""
    nodes = sorted(set(node_of))
    ranks = [[r for r in range(len(node_of)) if node_of[r] == n] for n in nodes]
    return [on[:2] for on in ranks], [[ranks[0][i], ranks[1][i]] for i in range(2)]


def nodes_section(page: Page) -> None:
    """On emulated (or real) nodes: one step's tensor-parallel all-reduces of the tiny GPT on
    a tp group of 2 inside a node, then across nodes, each beside the cost model's price on its
    link, both links measured first (lesson 04's ping-pong, at the all-reduce's size)."""
    node_of = minipar.node_map()
    if len(set(node_of)) < 2 or min(node_of.count(n) for n in set(node_of)) < 2:
        page.say("(`minipar lesson 08 --nodes 2` as root measures tp inside a node and across.)")
        return
    inside, across = tp_pairs(node_of)
    groups = {}
    for name, pairs in (("inside a node", inside), ("across nodes", across)):
        made = [minipar.new_group(pair) for pair in pairs]  # every rank makes every group
        groups[name] = next((g for g, pair in zip(made, pairs) if page.rank in pair), None)
    calls = 4 * TINY.layers  # f's and g's all-reduces: two forward, two backward per block
    x = np.ones(TINY.global_batch * TINY.seq_len * TINY.hidden, dtype=np.float32)
    step = page.machine().step_s  # minipar's Python per step, on either link
    links = {}
    for name, pairs in (("inside a node", inside), ("across nodes", across)):
        wire = measured_link(page, pairs[0][1], x.nbytes, name)
        links[name] = cost.Link(name, wire.alpha + step, wire.beta, wire.gamma)
    page.prediction(f"tp=2's {calls} all-reduces of {fmt_bytes(x.nbytes)} a step, two links")
    page.say(f"The nodes are joined by an emulated link of {wires.describe(link_bits())}; both "
             "links measured first (ping-pong at the all-reduce's size).")  # fmt: skip
    predicted = {n: calls * cost.predict("all_reduce", "ring", x.nbytes, 2, link)
                 for n, link in links.items()}  # fmt: skip

    def timed(group) -> float:
        minipar.barrier()
        start = time.perf_counter()
        if group is not None:
            for _ in range(calls):
                minipar.all_reduce(x, group=group, algorithm="ring")
        return max(page.gather(time.perf_counter() - start))

    paired = page.alternate(partial(timed, groups["across nodes"]),
                            partial(timed, groups["inside a node"]), 3)  # fmt: skip
    measured = dict(zip(("across nodes", "inside a node"), paired.seconds))
    page.measurement("the same all-reduces, alternated (slowest rank, medians of 3 pairs)")
    rows = [(n, fmt_time(predicted[n]), fmt_time(measured[n])) for n in groups]
    slow = {"p": predicted["across nodes"] / predicted["inside a node"], "m": paired.ratio}
    rows.append(("across / inside", f"{slow['p']:.2f}x", f"{slow['m']:.2f}x"))
    page.table(None, ["tp group", "predicted>", "measured>"], rows)
    page.say(
        "Tensor parallelism all-reduces activations in every block, forward and backward: on "
        "the slow link every one of them pays. That is why the mesh puts tp innermost, so a "
        "launcher that fills a node keeps it inside (DeviceMesh.placement says where it runs)."
    )
    for name in groups:
        page.claim(f"tp=2's all-reduces {name}", predicted[name], measured[name], "s",
                   C.BANDWIDTH_BOUND, basis="links measured by ping-pong")  # fmt: skip
    reference = "the same all-reduces inside a node, alternated"
    page.ratio_claim(
        "tp across nodes / inside a node (time ratio)",
        slow["p"],
        paired,
        reference,
        C.BANDWIDTH_BOUND,
        basis="links measured by ping-pong",
    )
    page.ratio_claim("tp across nodes is slower (time ratio)", 1.0, paired, reference,
                     C.at_least())  # fmt: skip


def main(argv=None) -> int:
    page = Page("08", "Putting it together: DP x TP x PP", argv=argv)
    dp, tp, pp = default_layout(page.size)
    mesh = DeviceMesh(dp=dp, tp=tp, pp=pp)
    mesh_section(page, mesh)
    microbatches = min(4, TINY.global_batch // dp)
    traffic_section(page, mesh, microbatches)
    placement_section(page)
    nodes_section(page)
    planner_section(page)
    measured_run_section(page, mesh, microbatches)
    recompute_section(page, mesh, microbatches)
    page.try_this(
        [
            "minipar lesson 08 -n 4: which layout does it pick, and what changes in the traffic?",
            "minipar plan --model 70b --nodes 4 --zero 1 --all: why is each rejected layout out?",
            "minipar plan --model 7b --gpus 16 --micro-batch 1: watch the bubble shrink with m.",
            "minipar train --dp 2 --pp 2 --microbatches 4 --steps 2 --trace t.json: open t.json "
            "in ui.perfetto.dev; where does the all-reduce run, where is the bubble?",
        ]
    )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
