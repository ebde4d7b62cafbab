"""`minipar plan --cluster here`: this machine as the planner prices it, from its calibration.

    cluster = here_cluster()     # the "cpu" preset with this machine's calibrated numbers
    cluster = on_nodes(cluster, per_node=2, bits=200e6)   # as `minipar run --nodes --link` makes

The links (inside and between "nodes": one machine) are the calibration's collective step
(cost.calibration.step_link: the MPI message plus minipar's Python per step, its gamma), the peak
rate the tiny GPT's matmul rate it measured, per core. The rest (ops per layer, the overhead per
op, fp32) stays the "cpu" preset's. No usable calibration (none, stale, another host, an
unphysical fit): a ValueError naming `minipar calibrate`. The presets keep their datasheet
numbers and their names.
"""

from __future__ import annotations

from dataclasses import replace

from minipar import cost
from minipar.cost import calibration
from minipar.planning.planner import CLUSTERS, Cluster

NAME = "here"


def on_nodes(cluster: Cluster, per_node: int | None = None, bits: float | None = None) -> Cluster:
    """The cluster with `per_node` GPUs (ranks) a node and, with `bits`, nodes joined as
    `minipar run --nodes N --link RATE` joins them: one cable a node (nics_per_node 1: the
    node's crossing ranks share it), `bits` per second each way (cost.cable). Inside a node the
    cluster's own link."""
    if per_node is not None and (isinstance(per_node, bool) or per_node < 1):
        raise ValueError(f"per_node={per_node!r} (--per-node) must be a positive integer")
    h = cluster.hierarchy
    k = per_node or h.per_node
    if bits is None:
        return replace(cluster, hierarchy=cost.Hierarchy(h.intra, h.inter, k))
    between = cost.cable(bits)
    return replace(cluster, hierarchy=cost.Hierarchy(h.intra, between, k), nics_per_node=1)


def here_cluster(where=None) -> Cluster:
    record = calibration.load(where)
    why = calibration.unusable(record)
    if why:
        hint = "" if "minipar calibrate" in why else " (run `minipar calibrate`)"
        raise ValueError(f"--cluster here prices this machine on its calibration: {why}{hint}")
    link = calibration.step_link(record)
    base = CLUSTERS["cpu"]
    peak = base.peak_flops
    if record.get("matmul_flops"):  # per rank, `ranks` ranks at once on `cores`: per core
        peak = record["matmul_flops"] * max(1.0, record.get("ranks", 1) / record["cores"])
    return replace(
        base,
        name=NAME,
        hierarchy=cost.Hierarchy(link, link, base.hierarchy.per_node),
        peak_flops=peak,
        source=f"this machine: {link.source} (minipar calibrate); ops per layer as the cpu preset",
    )
