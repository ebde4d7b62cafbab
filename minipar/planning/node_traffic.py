"""Where a layout's groups run, and what crosses the node boundary: the planner's node-aware
terms (planner.py adds them to a layout's time; plan_table.py shows them).

    spanned(size, stride, per_node)                 # nodes one group's ranks lie on
    sharding_bytes(psi, dp, dp_per_node, mode, s)   # {"inside", "across"} bytes per step
    sharding_time(psi, dp, dp_per_node, mode, s, h) # seconds of the same traffic

A group of g ranks `stride` apart on nodes of k GPUs (consecutive ranks fill a node; tp
innermost, then cp, dp, pp, as DeviceMesh lays them) has k/stride of its ranks in a node, so
it lies on ceil(g / (k/stride)) nodes (a tp group: ceil(g/k)); when that is more than one its
collectives run at the inter-node link's rate: a ring is as slow as its slowest hop.

Data parallelism over p ranks, Psi the bytes of one rank's gradients (= its parameters):
- "ddp": one all-reduce of the gradients. A ring over p ranks sends 2(p-1)/p Psi per rank;
  across nodes the planner prices minipar's two-level all-reduce (reduce-scatter inside, the
  k-th of it across, all-gather inside), so a node of k dp ranks over n nodes sends
  2(n-1)/n Psi across (k ranks each 2(n-1)/n Psi/k); when p is not a multiple of k, a flat
  ring: one crossing hop per node, 2(p-1)/p Psi.
- "full" (FSDP / ZeRO-3 over all p): the parameters all-gathered in forward and again in
  backward, the gradients reduce-scattered: 3 rings of (p-1) steps of Psi/p, 3(p-1)/p Psi per
  rank. A ring over n nodes has one crossing hop out of each node: 3(p-1)/p Psi across per node.
- "hybrid" (shard inside a group of s ranks in a node, replicate over r = p/s nodes; torch's
  HSDP, minipar's FullyShardedDataParallel(replicate_group=...)): inside, 2(s-1)/s Psi of
  all-gathers and (s-1)/s Psi of reduce-scatter per rank; across, one all-reduce of the rank's
  gradient shard Psi/s over r: 2(r-1)/r Psi/s per rank, 2(r-1)/r Psi per node of s ranks.
"""

from __future__ import annotations

import math

from minipar import cost

MODES = ("ddp", "full", "hybrid")


def spanned(size: int, stride: int, per_node: int) -> int:
    """Nodes a group of `size` ranks `stride` apart lies on: ceil(size / (per_node/stride))."""
    return max(1, math.ceil(size / max(1, per_node // stride)))


def group_link(size: int, stride: int, per_node: int, h: cost.Hierarchy) -> cost.Link:
    """The link a group's collectives run at: the node's own if it fits one, else between."""
    return h.intra if spanned(size, stride, per_node) == 1 else h.inter


def placement(dp: int, tp: int, pp: int, cp: int, ep: int, per_node: int) -> dict:
    """{axis: nodes its groups span} for every axis of degree > 1, in DeviceMesh's order."""
    groups = {"tp": (tp, 1), "cp": (cp, tp), "dp": (dp, tp * cp), "ep": (ep, tp * cp)}
    groups["pp"] = (pp, tp * cp * dp)
    return {a: spanned(g, d, per_node) for a, (g, d) in groups.items() if g > 1}


def where(nodes: int) -> str:
    """ "inside a node" or "across N nodes"."""
    return "inside a node" if nodes == 1 else f"across {nodes} nodes"


def check_shard(dp: int, shard: int) -> None:
    """A hybrid shard group of `shard` ranks must divide the dp group (clear error if not)."""
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 1:
        raise ValueError(f"dp_shard={shard!r} (--dp-shard) must be a positive integer")
    if dp % shard:
        raise ValueError(f"dp_shard={shard} (--dp-shard) must divide dp={dp}")


def sharding_bytes(psi: float, dp: int, dp_per_node: int, mode: str, shard: int = 0) -> dict:
    """Bytes of one step's data-parallel traffic: "inside" per rank on the node's link, "across"
    out of one node over the link between nodes (the module docstring's formulas)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if dp == 1:
        return {"inside": 0.0, "across": 0.0}
    k = min(dp, dp_per_node)
    nodes = math.ceil(dp / k)
    p = dp
    if mode == "hybrid":
        check_shard(dp, shard)
        s, r = shard, dp // shard
        inside = 3 * (s - 1) / s * psi
        across = 2 * (r - 1) / r * psi / s * min(s, k) if r > 1 else 0.0
        if s > k:  # a shard group wider than a node: its rings cross too
            across += 3 * (s - 1) / s * psi
        return {"inside": inside, "across": across}
    passes = 3 if mode == "full" else 2
    if nodes == 1:
        return {"inside": passes * (p - 1) / p * psi, "across": 0.0}
    if mode == "ddp" and dp % k == 0:  # the two-level all-reduce
        return {"inside": 2 * (k - 1) / k * psi, "across": 2 * (nodes - 1) / nodes * psi}
    return {"inside": 0.0, "across": passes * (p - 1) / p * psi}


def sharding_time(
    psi: float, dp: int, dp_per_node: int, mode: str, shard: int, h: cost.Hierarchy, nics: int = 0
) -> float:
    """Seconds of one step's data-parallel traffic (all of it; the planner subtracts what hides
    behind the backward pass), each collective on the link its group spans. `nics`: links out
    of a node (0: one per GPU); when fewer than the ranks of a node that cross at once (hybrid's
    all-reduce across, the two-level all-reduce's middle phase), they share them: each sends
    ceil(ranks / nics) times its bytes' worth of time. A ring has one crossing hop a node."""
    if dp == 1:
        return 0.0
    k = min(dp, dp_per_node)
    if mode == "hybrid":
        check_shard(dp, shard)
        s, r = shard, dp // shard
        in_link = h.intra if s <= k else h.inter
        inside = 2 * cost.predict("all_gather", "ring", psi, s, in_link)
        inside += cost.predict("reduce_scatter", "ring", psi, s, in_link)
        share = math.ceil(min(s, k) / nics) if nics else 1
        across = cost.predict("all_reduce", "ring", psi / s * share, r, h.inter) if r > 1 else 0.0
        return inside + across
    if mode == "full":  # 3 rings of p-1 steps: 1.5 ring all-reduces' steps and bytes
        link = h.intra if dp <= k else h.inter
        return 1.5 * cost.predict("all_reduce", "ring", psi, dp, link)
    if dp <= k:
        return cost.predict("all_reduce", "ring", psi, dp, h.intra)
    if dp % k:
        return cost.predict("all_reduce", "ring", psi, dp, h.inter)
    if nics:  # reduce-scatter inside, all-reduce of the k-th across (shared links), gather inside
        inside = cost.predict("reduce_scatter", "ring", psi, k, h.intra)
        inside += cost.predict("all_gather", "ring", psi, k, h.intra)
        across = cost.predict("all_reduce", "ring", psi / k * math.ceil(k / nics), dp // k, h.inter)
        return inside + across
    two_level = cost.Hierarchy(h.intra, h.inter, k)
    return cost.all_reduce_on_cluster(psi, dp // k, "hierarchical", two_level)
