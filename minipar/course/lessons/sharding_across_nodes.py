"""Lesson 05's last section, on nodes: DDP, full sharding and hybrid sharding across a slow link.

    minipar lesson 05 --nodes 2 --link 200mbit     # as root: 2 emulated nodes x 2 ranks

The same MLP trained three ways on N nodes of k ranks (p = N k), Psi its fp32 gradient bytes:

- DDP: one all-reduce of the gradients. Across nodes minipar runs the two-level all-reduce
  (reduce-scatter inside a node, all-reduce of the k-th across, all-gather inside): each of a
  node's k ranks sends 2 (N-1)/N Psi/k across, so 2 (N-1)/N Psi leave a node per step.
- Full sharding (FSDP over all p ranks): per sharding unit two all-gathers of the parameters
  (forward, backward) and one reduce-scatter of the gradients, each two-level across nodes:
  (N-1)/N of the unit's (padded) bytes leave a node per collective, 3 (N-1)/N Psi per step.
- Hybrid sharding (FSDP inside the node's k ranks, replicated across the N nodes: torch's
  HSDP, torchtitan's dp_shard x dp_replicate): the gathers and the reduce-scatter stay inside;
  one all-reduce of each rank's gradient shard Psi/k over its N copies crosses, a ring of N:
  2 (N-1)/N Psi/k per rank, 2 (N-1)/N Psi per node. DDP's bytes across, with a k-th of the
  parameters held.

The prediction prices each collective as `auto` runs it (the two-level schemes, or the
pipelined two-level all-reduce for large buffers) on the two links measured first (lesson 04's
ping-pong); the step is the measured
compute plus that communication (minipar's FSDP waits for each gather, and DDP's one bucket
fills only at the end of backward: nothing hides).
"""

from __future__ import annotations

import math
from functools import partial

import minipar
from minipar import cost
from minipar.collectives.registry import auto_choice
from minipar.course import claims as C
from minipar.course.lessons.l04_topology_bandwidth import between_nodes
from minipar.course.lessons.mlp_steps import build, data, one_step, step_spread
from minipar.course.lessons.page import Page, fmt_bytes, fmt_time
from minipar.course.machine import link_bits, this_machine
from minipar.launcher.cluster import link as wires

MODES = ("DDP", "full sharding", "hybrid sharding")


def node_widths(quick: bool) -> tuple[int, ...]:
    """An MLP whose gradients take longer on the slow link than its step computes."""
    return (256, 512, 512, 256) if quick else (512, 1024, 1024, 512)


def unit_sizes(w: tuple[int, ...]) -> list[int]:
    """Elements of each Linear (weight + bias): one FSDP sharding unit each."""
    return [a * b + b for a, b in zip(w[:-1], w[1:])]


def padded(n: int, parts: int) -> int:
    """FSDP's flat vector of n elements, padded to a multiple of the group's size."""
    return math.ceil(n / parts) * parts


def across_bytes(units: list[int], nodes: int, k: int) -> dict:
    """Bytes that leave one node per step (the module docstring's formulas, fp32)."""
    psi = 4 * sum(units)
    out = 2 * (nodes - 1) / nodes
    return {
        "DDP": out * psi,
        "full sharding": 3 * (nodes - 1) / nodes * 4 * sum(padded(u, nodes * k) for u in units),
        "hybrid sharding": out * 4 * sum(padded(u, k) for u in units),
    }


def comm_seconds(units: list[int], nodes: int, k: int, intra, inter) -> dict:
    """One step's communication, each collective as `auto` runs it (the registry's choice on
    the links it prices with), priced on the links measured here (one cable a node)."""
    p, psi = nodes * k, 4 * sum(units)
    chooses = (cost.default_link(), cost.inter_link())

    def priced(collective, nbytes, per_node=k, chosen_at=None):
        shape = (nodes, per_node)
        algorithm = auto_choice(collective, chosen_at or nbytes, nodes * per_node, shape, chooses)
        return cost.predict_on_nodes(collective, algorithm, nbytes, *shape, intra, inter)

    full = sum(2 * priced("all_gather", 4 * padded(u, p)) +
               priced("reduce_scatter", 4 * padded(u, p)) for u in units)  # fmt: skip
    inside = sum(2 * cost.predict("all_gather", "ring", 4 * padded(u, k), k, intra) +
                 cost.predict("reduce_scatter", "ring", 4 * padded(u, k), k, intra)
                 for u in units)  # fmt: skip
    shards = 4 * sum(padded(u, k) for u in units)  # a node's k replicate rings cross at once
    across = priced("all_reduce", shards, per_node=1, chosen_at=shards // k)
    return {"DDP": priced("all_reduce", psi), "full sharding": full,
            "hybrid sharding": inside + across}  # fmt: skip


def hybrid_groups(page: Page, node_of):
    """(this rank's node, the ranks at its place on every node): hybrid sharding's shard and
    replicate groups, whatever the launcher's fill. Every rank makes every group."""
    on = [[r for r in range(page.size) if node_of[r] == n] for n in sorted(set(node_of))]
    mine = []
    for ranks in on + [list(copies) for copies in zip(*on)]:
        made = minipar.new_group(ranks)
        if page.rank in ranks:
            mine.append(made)
    return mine[0], mine[1]


def strategies(page: Page, w, node_of) -> dict:
    # here, not at the top of the file: torch loads only when used
    from minipar.parallel import DistributedDataParallel, FullyShardedDataParallel

    shard, replicate = hybrid_groups(page, node_of)
    return {
        "DDP": DistributedDataParallel(build(page.quick, w)),
        "full sharding": FullyShardedDataParallel(build(page.quick, w)),
        "hybrid sharding": FullyShardedDataParallel(
            build(page.quick, w), group=shard, replicate_group=replicate
        ),
    }


def nodes_section(page: Page) -> None:
    """On emulated (or real) nodes of equal size: the three strategies' bytes across and step
    times, predicted from the two measured links, then measured."""
    node_of = minipar.node_map()
    nodes, k = len(set(node_of)), node_of.count(node_of[0])
    if nodes < 2 or k < 2 or nodes * k != page.size:
        page.say("(`minipar lesson 05 --nodes 2 --link 200mbit` as root: the same strategies "
                 "across a slow link between nodes.)")  # fmt: skip
        return
    page.section(f"Across nodes: DDP, full sharding, hybrid sharding on {nodes} x {k}")
    machine = this_machine(page.comm)
    intra, inter = machine.collective, between_nodes(page, machine)
    cost.set_inter_link(inter)  # auto prices the measured link (every rank has rank 0's)
    try:
        predicted, measured = predict(page, nodes, k, intra, inter), measure(page, node_of)
    finally:
        cost.set_inter_link(None)
    judge(page, predicted, measured, machine.basis)


def predict(page: Page, nodes: int, k: int, intra, inter) -> dict:
    w = node_widths(page.quick)
    units = unit_sizes(w)
    psi = 4 * sum(units)
    page.prediction(f"MLP {'-'.join(map(str, w))}: Psi = {fmt_bytes(psi)} of fp32 gradients")
    page.say(
        f"The nodes are joined by an emulated link of {wires.describe(link_bits())}, measured "
        f"here: alpha {fmt_time(inter.alpha)}, {fmt_bytes(1 / inter.beta)}/s (with minipar's "
        f"step); inside a node {fmt_bytes(1 / intra.beta)}/s."
    )
    bytes_out = across_bytes(units, nodes, k)
    seconds = comm_seconds(units, nodes, k, intra, inter)
    held = {"DDP": psi, "full sharding": 4 * sum(padded(u, nodes * k) for u in units) / page.size,
            "hybrid sharding": 4 * sum(padded(u, k) for u in units) / k}  # fmt: skip
    page.table(
        None,
        ["strategy", "out of a node per step>", "parameters held per rank>", "communication>"],
        [(m, fmt_bytes(bytes_out[m]), fmt_bytes(held[m]), fmt_time(seconds[m])) for m in MODES],
        caption="DDP and hybrid send the same bytes across; full sharding 1.5x; hybrid holds "
        f"a {k}th of the parameters, full sharding a {page.size}th",
    )
    return {"bytes": bytes_out, "seconds": seconds, "held": held}


def cable_bytes() -> int | None:
    """Bytes this node's eth0 has sent (/proc/self/net/dev: the node's network namespace on
    emulated nodes), or None where there is no eth0."""
    with open("/proc/self/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "eth0":
                return int(rest.split()[8])
    return None


def cable_during(comm, node_of, step, counter=cable_bytes) -> int | None:
    """The most bytes a node's cable sent while `step()` ran on every rank (None without an
    eth0). The counter is the node's, shared by its ranks: one rank a node reads it, and
    barriers fence the readings off the step. Each rank reading its own, as this did before,
    let a rank that left the barrier early send its first bytes before a later rank of its
    node took its reading, which then missed them: the cable seemed to carry less than the
    ledger (full sharding: 2.89 MiB measured, 3.01 MiB predicted)."""
    reader = node_of.index(node_of[comm.rank]) == comm.rank  # the node's first rank
    comm.barrier()
    before = counter() if reader else None
    comm.barrier()  # every node's reading taken before any rank of the step sends
    step()
    comm.barrier()  # every byte of the step received by now, so sent: on the counter
    seen = comm.allgather_object(None if before is None else counter() - before)
    seen = [s for s in seen if s is not None]
    return max(seen) if len(seen) == len(set(node_of)) else None


def traced(model, x, y, traces: list) -> None:
    """One step, its ledger (minipar.trace) added to `traces`."""
    with minipar.trace() as t:
        one_step(model, x, y)
    traces.append(t)


def measure(page: Page, node_of) -> dict:
    w = node_widths(page.quick)
    x, y = data(page, w)
    x.requires_grad_(True)  # so backward needs every unit's weight: 3 collectives each
    models = strategies(page, w, node_of)
    plain = build(page.quick, w)
    out = {"compute": step_spread(page, plain, x, y, reps=3), "bytes": {}, "held": {},
           "step": {}, "crossing": {}, "cable": {}}  # fmt: skip
    for mode, model in models.items():
        one_step(model, x, y)  # warm: the buffers and the groups' first messages
        traces = []
        out["cable"][mode] = cable_during(page.comm, node_of, partial(traced, model, x, y, traces))
        t, per_node = traces[0], {}
        for node, sent in zip(node_of, page.gather(t.bytes_sent(link="inter"))):
            per_node[node] = per_node.get(node, 0) + sent
        out["bytes"][mode] = max(per_node.values())
        out["crossing"][mode] = sorted({c.algorithm for c in t.calls if c.bytes_between_nodes})
        out["held"][mode] = max(page.gather(4 * sum(q.numel() for q in model.parameters())))
        out["step"][mode] = step_spread(page, model, x, y, reps=3)
    return out


def judge(page: Page, predicted: dict, measured: dict, basis: str) -> None:
    compute = measured["compute"][1]
    page.measurement(f"the ledger's bytes, and the step (median of 3; compute alone "
                     f"{fmt_time(compute)})")  # fmt: skip
    rows = []
    for m in MODES:
        step, seen = predicted["seconds"][m] + compute, measured["step"][m][1]
        crossed = ", ".join(measured["crossing"][m])
        rows.append((m, fmt_bytes(measured["bytes"][m]), fmt_time(step), fmt_time(seen), crossed))
    page.table(None, ["strategy", "out of a node>", "step predicted>", "step measured>",
                      "what crossed"], rows)  # fmt: skip
    for m in MODES:
        page.claim(f"{m}: bytes out of a node per step (the ledger)", predicted["bytes"][m],
                   measured["bytes"][m], "B", C.relative(0.01), "bytes")  # fmt: skip
        page.claim(f"{m}: parameters held per rank", predicted["held"][m],
                   measured["held"][m], "B", C.EXACT, "bytes")  # fmt: skip
        if measured["cable"][m] is not None:  # at least the ledger's, + TCP/IP's headers and acks
            page.claim(f"{m}: bytes on the node's cable (eth0's counter)", predicted["bytes"][m],
                       measured["cable"][m], "B", C.Tolerance("at_most", 0.1), "bytes",
                       bound=(predicted["bytes"][m], math.inf))  # fmt: skip
    for m in MODES:
        page.claim(f"{m}: one step across the link", predicted["seconds"][m] + compute,
                   measured["step"][m][1], "s", C.BANDWIDTH_BOUND,
                   spread=measured["step"][m], basis=basis)  # fmt: skip
    full, hybrid = (predicted["seconds"][m] + compute for m in MODES[1:])
    seen = measured["step"]["full sharding"][1] / measured["step"]["hybrid sharding"][1]
    page.claim("full / hybrid sharding step time", full / hybrid, seen, "x", C.BANDWIDTH_BOUND,
               basis=basis)  # fmt: skip
    page.claim("hybrid sharding beats full sharding across the link", 1.0, seen, "x",
               C.at_least())  # fmt: skip
    page.say(
        "Hybrid sharding keeps the parameters' gathers on the fast link and sends across only "
        "what DDP sends, for a k-th of the memory DDP holds: the trade torch's HSDP and "
        "torchtitan's dp_replicate x dp_shard make on real clusters. Full sharding saves "
        "memory again (a p-th), and pays for it with every gather on the slow link."
    )
