"""`minipar plan --cluster here`: this machine as the planner prices it, from its calibration.

    cluster = here_cluster()     # the "cpu" preset with this machine's calibrated numbers

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
