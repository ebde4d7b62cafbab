"""Lesson 11: at scale, on a simulated cluster (text: lessons/11_at_scale.md).

    minipar lesson 11 -n 2 --quick            # minipar.course.lessons.l11_at_scale

The ring, the binomial tree and the double tree of minipar/collectives/ run unchanged on a
simulated cluster of DGX H100 nodes (minipar/simulate/: one thread per rank, virtual clocks):
first the cost model's prediction from 8 to 8,192 ranks (where the ring's latency term takes
over), then the simulated times; one ring against one ring per NIC across two nodes; NCCL's
protocols (why 8 B costs 15 us and a ring reaches 370 GB/s, not 450) and its pick; one 1F1B
step of the 70B layout minipar plan proposes for 1,024 GPUs, its bubble read off simulated time;
and every collective checked against numpy at prime p. Rank 0 simulates, every rank checks its
numbers.
"""

from __future__ import annotations

import math

from minipar.course import claims as C
from minipar.course.lessons.page import Page, fmt_rate, fmt_time
from minipar.planning.planner import CLUSTERS, ModelSpec, best, plan_layouts
from minipar.simulate.cluster import preset
from minipar.simulate.conformance import check_collectives, checks
from minipar.simulate.published import FIGURES
from minipar.simulate.sweep import all_reduce_row, predicted, row
from minipar.simulate.train_step import from_layout, simulate_step
from minipar.simulate.validate import class_table, run_figure

SIZE = 64 << 20  # the all-reduce of the first section: 64 MiB, a DDP bucket or two
BIG = 1 << 30  # the across-nodes comparison: 1 GiB
CLUSTER = preset("h100")
WORLDS = (8, 64, 512, 8192)  # predicted
ALGORITHMS = ("ring", "tree", "double_tree")
SIMULATED = {  # (quick, full): the world sizes each algorithm is simulated at
    "ring": ((8, 64), (8, 64, 256)),
    "tree": ((8, 64, 512), (8, 64, 512, 4096)),
    "double_tree": ((8, 64, 512), (8, 64, 512, 4096)),
}


def predictions():
    """{(algorithm, p): predicted seconds} of a 64 MiB all-reduce on H100 nodes."""
    return {(a, p): predicted(a, SIZE, p, CLUSTER) for a in ALGORITHMS for p in WORLDS}


def crossover() -> int:
    """The smallest power of two p at which the tree's prediction beats the ring's (64 MiB)."""
    p = 8
    while predicted("tree", SIZE, p, CLUSTER) >= predicted("ring", SIZE, p, CLUSTER):
        p *= 2
    return p


def tree_chain(p: int, nbytes: float = SIZE, cluster=CLUSTER) -> float:
    """The binomial tree as its code runs: reduce up, broadcast down, 2 log2 p levels one after
    the other, each a message of the whole buffer on the link that level crosses (the first
    log2 per_node levels inside a node, the rest between nodes)."""
    levels = int(math.log2(p))
    inside = min(levels, int(math.log2(cluster.per_node)))
    hop = {link: link.alpha + nbytes * link.beta for link in (cluster.intra, cluster.inter)}
    return 2 * (inside * hop[cluster.intra] + (levels - inside) * hop[cluster.inter])


def chain_crossover() -> int:
    """The smallest power of two p at which the tree as it runs (tree_chain) beats the ring."""
    p = 8
    while tree_chain(p) >= predicted("ring", SIZE, p, CLUSTER):
        p *= 2
    return p


def across_nodes_prediction() -> tuple[float, float]:
    """(one ring's busbw, one ring per NIC's busbw) across nodes, at large sizes: one NIC's
    rate, and the NICs' rates added up unless NVLink is slower."""
    nic = 1 / CLUSTER.inter.beta
    return nic, min(1 / CLUSTER.intra.beta, CLUSTER.nics * nic)


def claims() -> list[str]:
    """Numbers lessons/11_at_scale.md states; tests/test_lessons.py checks the text."""
    table = predictions()
    out = [fmt_time(table[(a, 8192)]) for a in ("ring", "tree")]
    out.append(f"p = {crossover():,}")
    out.append(f"p = {chain_crossover():,}")
    out += [fmt_rate(r) for r in across_nodes_prediction()]
    out.append(fmt_time(predicted("hierarchical", BIG, 16, CLUSTER)))
    _, lay = planned_layout()
    out.append(f"dp {lay.dp} x tp {lay.tp} x pp {lay.pp}, {lay.microbatches} micro-batches")
    out.append(f"{(lay.pp - 1) / (lay.microbatches + lay.pp - 1):.1%}")
    return out


def scale_section(page: Page, rank0) -> None:
    table = predictions()
    page.prediction(f"a {SIZE >> 20} MiB all-reduce on DGX H100 nodes, the cost model")
    rows = [(f"{p:,}", *(fmt_time(table[(a, p)]) for a in ALGORITHMS)) for p in WORLDS]
    page.table(None, ["ranks>", "ring>", "tree>", "double tree>"], rows)
    page.say(
        f"The ring pays 2 (p-1) alphas: from p = {crossover():,} on the tree's 2 log2 p "
        "messages of the whole buffer cost less (the latency term takes over)."
    )
    page.measurement("the unchanged algorithms, simulated (rank 0 runs every rank)")
    seen = rank0(lambda: _simulate_scale(page.quick))
    rows = [
        (f"{r['world_size']:,}", r["algorithm"], fmt_time(r["time_s"]), fmt_time(r["predicted_s"]),
         f"{r['messages']:,}", r["wrong"])
        for r in seen
    ]  # fmt: skip
    page.table(None, ["ranks>", "algorithm", "simulated>", "model>", "messages>", "wrong>"], rows)
    rings = [r for r in seen if r["algorithm"] == "ring"]
    page.check(
        all(abs(r["time_s"] / r["predicted_s"] - 1) < 1e-9 for r in rings),
        "the simulated ring meets the closed form 2(p-1) alpha + 2(p-1)/p n beta exactly",
    )
    for r in seen:
        if r["algorithm"] == "tree":
            page.claim(f"the simulated tree at p = {r['world_size']} is its chain of 2 log2 p "
                       "levels", tree_chain(r["world_size"]), r["time_s"], "s",
                       C.relative(1e-6), "value", basis="preset h100, simulated")  # fmt: skip
    page.say(
        f"The cost model's tree counts the busiest rank's bytes, not the levels one after the "
        f"other: its tree wins from p = {crossover():,}; the tree as it runs (the chain, which "
        f"the simulator meets) wins from p = {chain_crossover():,}."
    )
    page.check(sum(r["wrong"] for r in seen) == 0, "every rank's result is the exact sum")


def _simulate_scale(quick: bool) -> list[dict]:
    rows = []
    for algorithm in ALGORITHMS:
        for p in SIMULATED[algorithm][0 if quick else 1]:
            rows.append(all_reduce_row(p, CLUSTER, SIZE, algorithm))
    return rows


def nodes_section(page: Page, rank0) -> None:
    one, many = across_nodes_prediction()
    two_level = predicted("hierarchical", BIG, 16, CLUSTER)
    page.prediction("a 1 GiB all-reduce across 2 nodes: one ring, two levels, a ring per NIC")
    page.say(
        f"One ring crosses each node boundary once: busbw {fmt_rate(one)}, one NIC's rate. "
        f"Two levels (hierarchical.py: inside the node, across, inside again) send an 8th of "
        f"the bytes across, all 8 NICs at once: {fmt_time(two_level)}. NCCL runs "
        f"{CLUSTER.nics} rings at once, ring c entering each node at GPU c, so every NIC "
        f"carries one: busbw up to {fmt_rate(many)}."
    )
    page.measurement("simulated on 16 ranks (2 DGX H100 nodes)")
    names = ("ring", "hierarchical", "rings")
    seen = rank0(lambda: [all_reduce_row(16, CLUSTER, BIG, a) for a in names])
    rows = [
        (r["algorithm"], fmt_time(r["time_s"]), fmt_time(r["predicted_s"]),
         fmt_rate(r["busbw_GBps"] * 1e9))
        for r in seen
    ]  # fmt: skip
    page.table(None, ["algorithm", "time>", "model>", "busbw>"], rows)
    ring, levels, rings = seen
    page.check(
        abs(levels["time_s"] / two_level - 1) < 1e-9,
        "the two-level all-reduce meets its formula exactly",
    )
    page.check(
        rings["busbw_GBps"] > 5 * ring["busbw_GBps"],
        "one ring per NIC: more than 5x the bus bandwidth of one ring",
    )


PROTOCOL_ROWS = (  # (ranks, bytes, algorithm, protocol, what nccl-tests published, unit)
    (8, 8, "nccl", None, 12.49, "us"),  # deepseek-ai/DeepEP#303 (8 H20: the H100's NVLink)
    (8, 1 << 20, "nccl", None, None, "us"),
    (8, BIG, "ring", None, 370.0, "GB/s"),  # NVIDIA/nccl-tests#212
    (8, BIG, "ring", "nccl", 370.0, "GB/s"),
    (8, 8 * BIG, "nccl", None, 480.0, "GB/s"),  # nccl-tests#212: NVLink SHARP
    (16, BIG, "rings", "nccl", 376.0, "GB/s"),  # nccl-tests#290: 46-48 GB/s a NIC
)


def protocols_section(page: Page, rank0) -> None:
    page.prediction("what NCCL's tuner charges (src/graph/tuning.cc) on 8 H100s of one node")
    page.say(
        "8 B: the ring with LL, 6.6 us to start (the kernel's launch and set-up) and 14 hops of "
        "0.6 us (a flag in every 8 bytes: no fence) = 15.0 us; a tree with LL 15.2; NVLink "
        "SHARP 25. 1 GiB: the ring with Simple (whole chunks, a fence and a flag: 3.4 us a "
        "hop, full speed) at NCCL's 20.6 GB/s an NVLink link x 18 = 370.8 GB/s, not the "
        "datasheet's 450; NVLink SHARP sums in the switch and moves n (1 + 1/p) a port instead "
        "of 2 (p-1)/p n: 0.85 x 370.8 GB/s (nvlsEfficiency)."
    )
    page.measurement("simulated with NCCL's protocols (minipar/simulate/protocols.py)")
    seen = rank0(
        lambda: [row("all_reduce", p, CLUSTER, n, a, pr) for p, n, a, pr, *_ in PROTOCOL_ROWS]
    )
    rows = []
    for (p, n, _, _, published, unit), r in zip(PROTOCOL_ROWS, seen):
        value = r["time_s"] * 1e6 if unit == "us" else r["busbw_GBps"]
        rows.append(
            (f"{p}", _size(n), r["algorithm"], r["protocol"] or "none",
             f"{value:.1f} {unit}", f"{published} {unit}" if published else "-")
        )  # fmt: skip
    page.table(None, ["ranks>", "size>", "ran", "protocol", "simulated>", "published>"], rows)
    errors = _class_errors(rank0)
    page.say(
        "How far to trust these rows: the simulator against the published figures it was not "
        "fitted to (minipar simulate validate), per size class: "
        + "; ".join(
            f"{c['class']}: {c['geomean']:.0%} geometric-mean error, worst {c['worst']:.0%} "
            f"({c['count']} figures)"
            if c["count"]
            else f"{c['class']}: no figure yet"
            for c in errors
        )
        + "."
    )
    tiny, _, line_rate, ring, nvls, rings = seen
    page.check(
        abs(tiny["time_s"] / tiny["predicted_s"] - 1) < 1e-6 and tiny["protocol"] == "LL",
        "8 B: NCCL's pick, the ring with LL, and its simulated time is NCCL's formula",
    )
    page.check(
        line_rate["busbw_GBps"] > 420 > ring["busbw_GBps"] > 340,
        "1 GiB: the links as given run the ring near 450 GB/s; NCCL's Simple near 370",
    )
    page.check(
        nvls["algorithm"] == "nccl:nvls" and nvls["busbw_GBps"] > ring["busbw_GBps"] * 1.2,
        "8 GiB: NCCL's pick is NVLink SHARP, above any ring's bus bandwidth",
    )
    page.check(sum(r["wrong"] for r in seen) == 0, "every rank's result is the exact sum")


def _class_errors(rank0) -> list[dict]:
    """The validation run's error per size class, every node count together (validate.py),
    a figure at a time on rank 0 (the whole run is seconds: no rank waits that long)."""
    results = [rank0(lambda figure=figure: run_figure(figure)) for figure in FIGURES]
    return [row for row in class_table(results) if row["nodes"] == "all"]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def planned_layout():
    """(model, layout) minipar plan proposes for a 70B model on 1,024 H100s."""
    model = ModelSpec.preset("70b")
    return model, best(plan_layouts(model, CLUSTERS["dgx-h100"], 1024))


def step_section(page: Page, rank0) -> None:
    model, lay = planned_layout()
    formula = (lay.pp - 1) / (lay.microbatches + lay.pp - 1)
    page.prediction("one 1F1B step of 70B on 1,024 H100s, as minipar plan lays it out")
    page.say(
        f"dp {lay.dp} x tp {lay.tp} x pp {lay.pp}, {lay.microbatches} micro-batches: the bubble "
        f"(p-1)/(m+p-1) = {formula:.1%} of the step; the planner's step {fmt_time(lay.step_time)}."
    )
    page.measurement(
        "the step simulated: every stage's 1F1B instruction list, then ring.py over dp"
    )
    seen = rank0(lambda: _simulate_step(model, lay))
    page.table(
        None,
        ["what", "simulated>", "formula>"],
        [("step", fmt_time(seen["time"]), fmt_time(lay.step_time)),
         ("bubble", f"{seen['bubble']:.1%}", f"{formula:.1%}")],
    )  # fmt: skip
    page.check(
        formula - 1e-9 <= seen["bubble"] < formula + 0.05,
        "the bubble read off the simulated step is the formula's, plus the activations' hops",
    )


def _simulate_step(model, lay) -> dict:
    cluster = CLUSTER.with_per_node(max(1, CLUSTER.per_node // lay.tp))
    run = simulate_step(from_layout(model, lay), cluster)
    return {"time": run.time, "bubble": run.bubble}


def conformance_section(page: Page, rank0) -> None:
    sizes = (13, 31) if page.quick else (13, 31, 64, 97)
    where = ", ".join(map(str, sizes))
    page.prediction(f"every collective and algorithm right at p = {where}, sizes p + 2")
    wrong = rank0(lambda: [w for p in sizes for w in check_collectives(p, p + 2)])
    pairs = len(list(checks(sizes[0], sizes[0] + 2)))
    page.measurement(f"{pairs} (collective, algorithm) pairs at each p, against numpy")
    for line in wrong[:5]:
        page.say(f"  {line}")
    page.check(not wrong, f"0 wrong results at p = {where}")


def main(argv=None) -> int:
    page = Page("11", "At scale: a simulated cluster", argv=argv)

    def rank0(work):
        """What rank 0 computed, on every rank (the others wait for it)."""
        return page.gather(work() if page.rank == 0 else None)[0]

    scale_section(page, rank0)
    nodes_section(page, rank0)
    protocols_section(page, rank0)
    step_section(page, rank0)
    conformance_section(page, rank0)
    page.try_this(
        [
            "minipar simulate all_reduce --ranks 1024 --sizes 1MiB:4GiB: ring, tree, double "
            "tree side by side, as nccl-tests prints them.",
            "--cluster pcie: one NIC a node shared by 8 GPUs. What does one ring per NIC buy?",
            "Write the rings yourself: exercises/ex11_nccl_rings.py, then `minipar grade 11`.",
            "Pipeline the double tree (NCCL streams segments): how close does it get to 2 n beta?",
            "minipar simulate all_reduce --ranks 8 --sizes 8B:1GiB:x8 --algorithms nccl: where "
            "does NCCL's pick switch from LL to LL128 to Simple, and to NVLink SHARP?",
            "minipar simulate validate: every published figure against the simulator.",
        ]
    )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
