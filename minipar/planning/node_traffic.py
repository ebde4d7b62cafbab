"""Where a layout's groups run, and what crosses the node boundary: the planner's node-aware
terms (planner.py adds them to a layout's time; plan_table.py shows them).

    spanned(size, stride, per_node, fill, nodes)   # nodes one group's ranks lie on
    senders(size, stride, per_node, fill, nodes)   # ranks of a node whose ring hop crosses
    sharding_bytes(psi, dp, dp_per_node, mode, s, where)   # {"inside", "across"} bytes a step
    sharding_time(psi, dp, dp_per_node, mode, s, h, nics, where)  # seconds of the same traffic

Ranks sit on `nodes` nodes of k GPUs, filled one of two ways (`minipar run --fill`):
- "block" (what launchers do): rank r on node r // k. A group of g ranks `stride` apart (tp
  innermost, then cp, dp, pp, as DeviceMesh lays them) has k/stride of its ranks in a node, so
  it lies on ceil(g / (k/stride)) nodes (a tp group: ceil(g/k)).
- "cyclic" (dealt round): rank r on node r mod N. The group's ranks i stride (i < g) fall on
  nodes i stride mod N, which repeat with period N / gcd(stride, N): the group lies on
  min(g, N / gcd(stride, N)) nodes. A tp group (stride 1) spans min(tp, N) nodes, a dp group
  tp apart on 2 nodes with tp even lies in one node: the fill swaps which axes cross.
When a group spans more than one node its collectives run at the inter-node link's rate: a
ring is as slow as its slowest hop.

minipar's rings (ring.py; DDP's buckets and FSDP's reductions run them) go round a group in
rank order, and every group of an axis runs its ring at once, so what a node's link carries is
the hops that leave it, over all the groups: `senders`. Block fill: a group's ring leaves each
node it spans once, and a node holds ranks of min(stride, k) groups (k/stride ranks of each):
min(stride, k) senders. Cyclic fill: consecutive members sit on different nodes, every hop
crosses, and all k ranks of a node send across. A node with fewer links than senders (`nics`:
an emulated node has one veth) shares them: each crossing byte costs ceil(senders / nics)
times its time on the link.

Data parallelism over p ranks (a dp group spanning n nodes, g_n = p / n of its ranks in a node),
Psi the bytes of one rank's gradients (= its parameters):
- "ddp": one all-reduce of the gradients. A ring over p ranks sends 2(p-1)/p Psi per rank;
  across nodes the planner prices a two-level all-reduce (reduce-scatter inside, the g_n-th
  of it across, all-gather inside; NCCL's and minipar's "hierarchical", which minipar's DDP
  buckets take across nodes: ddp.reduction_algorithm): each of a node's k ranks sends
  2(n-1)/n Psi/g_n across (block, one dp group a node: 2(n-1)/n Psi a node); when the nodes
  hold unequal parts of the group, the flat ring: `senders` x 2(p-1)/p Psi across a node.
- "full" (FSDP / ZeRO-3 over all p): the parameters all-gathered in forward and again in
  backward, the gradients reduce-scattered: 3 rings of (p-1) steps of Psi/p, 3(p-1)/p Psi per
  rank, `senders` x that across a node (block, one dp group a node: 3(p-1)/p Psi): NCCL's
  rings (the GPU presets). minipar's FSDP (`minipar`: the "cpu" preset) takes auto's
  two-level all-gather and reduce-scatter across equal nodes: each of them moves the g_n-th
  of the vector across, (n-1)/n Psi/g_n per rank, so 3(n-1)/n Psi/g_n per rank and step (block,
  one dp group a node: 3(n-1)/n Psi a node), and 3(g_n-1)/g_n Psi inside.
- "hybrid" (shard over s consecutive dp ranks, replicate over r = p/s; torch's HSDP, minipar's
  FullyShardedDataParallel(replicate_group=...)): the shard group's 3 rings, 3(s-1)/s Psi per
  rank, inside a node when it fits one (block: s <= g_n), else `senders` x that across; one
  all-reduce of the rank's gradient shard Psi/s over the replicate group (r ranks s dp ranks
  apart), 2(r-1)/r Psi/s per rank, `senders` of it across (block, shard in a node: 2(r-1)/r Psi
  a node). Cyclic fill on 2 nodes with s = 2 puts the shard pair across and the copies inside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from minipar import cost

MODES = ("ddp", "full", "hybrid")
FILLS = ("block", "cyclic")  # minipar run --fill's


def check_fill(fill) -> None:
    if fill not in FILLS:
        raise ValueError(f"fill={fill!r} (--fill) must be one of {', '.join(FILLS)}")


def n_nodes(gpus: int, per_node: int) -> int:
    """Nodes `gpus` ranks fill, k a node: ceil(gpus / k)."""
    return max(1, math.ceil(gpus / per_node))


def spanned(size: int, stride: int, per_node: int, fill: str = "block", nodes: int = 0) -> int:
    """Nodes a group of `size` ranks `stride` apart lies on: block, ceil(size / (k/stride));
    cyclic over `nodes` nodes, min(size, nodes / gcd(stride, nodes))."""
    check_fill(fill)
    if fill == "cyclic":
        if nodes < 1:
            raise ValueError(f"nodes={nodes!r}: cyclic fill needs the number of nodes")
        return min(size, nodes // math.gcd(stride, nodes))
    return max(1, math.ceil(size / max(1, per_node // stride)))


def senders(size: int, stride: int, per_node: int, fill: str = "block", nodes: int = 0) -> int:
    """Ranks of one node whose ring hop (each group of the axis round in rank order, all at once)
    goes to another node: 0 when a group fits a node; block, min(stride, k); cyclic, k."""
    if spanned(size, stride, per_node, fill, nodes) == 1:
        return 0
    return per_node if fill == "cyclic" else min(stride, per_node)


def group_link(size: int, stride: int, per_node: int, h: cost.Hierarchy, fill="block", nodes=0):
    """The link a group's collectives run at: the node's own if it fits one, else between."""
    return h.intra if spanned(size, stride, per_node, fill, nodes) == 1 else h.inter


def strides(dp: int, tp: int, pp: int, cp: int, ep: int) -> dict:
    """{axis: (group size, stride)} in DeviceMesh's order (tp, cp, dp, pp; ep over dp)."""
    return {"tp": (tp, 1), "cp": (cp, tp), "dp": (dp, tp * cp), "ep": (ep, tp * cp),
            "pp": (pp, tp * cp * dp)}  # fmt: skip


def placement(dp: int, tp: int, pp: int, cp: int, ep: int, per_node: int, fill="block") -> dict:
    """{axis: nodes its groups span} for every axis of degree > 1, in DeviceMesh's order."""
    nodes = n_nodes(dp * tp * pp * cp, per_node)
    groups = strides(dp, tp, pp, cp, ep)
    return {a: spanned(g, d, per_node, fill, nodes) for a, (g, d) in groups.items() if g > 1}


def where(nodes: int) -> str:
    """ "inside a node" or "across N nodes"."""
    return "inside a node" if nodes == 1 else f"across {nodes} nodes"


@dataclass(frozen=True)
class Where:
    """Where a dp group's ranks sit: `stride` apart among `nodes` nodes of `per_node` ranks,
    filled `fill` (block or cyclic)."""

    per_node: int
    stride: int = 1
    fill: str = "block"
    nodes: int = 0

    def span(self, size: int, apart: int = 1) -> int:
        """Nodes a group of `size` ranks `apart` dp ranks apart lies on."""
        return spanned(size, self.stride * apart, self.per_node, self.fill, self.nodes)

    def senders(self, size: int, apart: int = 1) -> int:
        return senders(size, self.stride * apart, self.per_node, self.fill, self.nodes)

    def even(self, size: int) -> int:
        """Ranks of a group of `size` (one dp rank apart) in each node it spans when every such
        node holds as many (two-level collectives need it), else 0."""
        n = self.span(size)
        if self.fill == "block" and n > 1:  # k/stride a node, the last node the rest
            a_node = max(1, self.per_node // self.stride)
            return a_node if size % a_node == 0 else 0
        return size // n if size % n == 0 else 0


def _where(dp: int, dp_per_node: int, where: Where | None) -> Where:
    """The dp group's place; without one, the old reading: one dp group, k = dp_per_node a node."""
    return where or Where(dp_per_node, 1, "block", n_nodes(dp, dp_per_node))


def check_shard(dp: int, shard: int) -> None:
    """A hybrid shard group of `shard` ranks must divide the dp group (clear error if not)."""
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 1:
        raise ValueError(f"dp_shard={shard!r} (--dp-shard) must be a positive integer")
    if dp % shard:
        raise ValueError(f"dp_shard={shard} (--dp-shard) must divide dp={dp}")


def sharding_bytes(
    psi: float,
    dp: int,
    dp_per_node: int,
    mode: str,
    shard: int = 0,
    where: Where | None = None,
    minipar: bool = False,
) -> dict:
    """Bytes of one step's data-parallel traffic: "inside" per rank on the node's link, "across"
    out of one node over the link between nodes (the module docstring's formulas). `where`: the
    dp groups' place (default: one group, dp_per_node of its ranks a node, block fill);
    minipar: full sharding's collectives across nodes two-level, as minipar's FSDP runs them."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if dp == 1:
        return {"inside": 0.0, "across": 0.0}
    w, p = _where(dp, dp_per_node, where), dp
    if mode == "hybrid":
        check_shard(dp, shard)
        s, r = shard, dp // shard
        ring_s = 3 * (s - 1) / s * psi  # 2 all-gathers and a reduce-scatter over s
        inside = ring_s if w.span(s) == 1 else 0.0
        across = 0.0 if w.span(s) == 1 else w.senders(s) * ring_s
        if r > 1:
            ring_r = 2 * (r - 1) / r * psi / s
            inside += ring_r if w.span(r, s) == 1 else 0.0
            across += 0.0 if w.span(r, s) == 1 else w.senders(r, s) * ring_r
        return {"inside": inside, "across": across}
    passes = 3 if mode == "full" else 2
    n, g_n = w.span(p), w.even(p)  # nodes, ranks of one dp group in each (0: unequal)
    if n == 1:
        return {"inside": passes * (p - 1) / p * psi, "across": 0.0}
    if g_n and (mode == "ddp" or minipar):  # two-level: every rank of the node crosses
        ranks = min(w.per_node, max(g_n, w.senders(p)))
        return {"inside": passes * (g_n - 1) / g_n * psi,
                "across": ranks * passes * (n - 1) / n * psi / g_n}  # fmt: skip
    return {"inside": 0.0, "across": w.senders(p) * passes * (p - 1) / p * psi}


def link_share(count: int, nics: int) -> int:
    """How many of a node's crossing messages share one of its links (nics 0: one per GPU)."""
    return max(1, math.ceil(count / nics)) if nics else 1


def _ring(collective: str, nbytes: float, size: int, across: bool, h, share: int) -> float:
    """A ring over `size` ranks, inside a node or across (its crossing bytes shared `share`)."""
    if not across:
        return cost.predict(collective, "ring", nbytes, size, h.intra)
    return cost.predict(collective, "ring", nbytes * share, size, h.inter)


def sharding_time(
    psi: float,
    dp: int,
    dp_per_node: int,
    mode: str,
    shard: int,
    h: cost.Hierarchy,
    nics: int = 0,
    where: Where | None = None,
    minipar: bool = False,
) -> float:
    """Seconds of one step's data-parallel traffic (all of it; the planner subtracts what hides
    behind the backward pass), each collective on the link its group spans. `nics`: links out
    of a node (0: one per GPU); when fewer than the node's ranks that cross at once (`senders`
    of a ring; all the node's ranks in the two-level all-reduce's middle phase), they share
    them: each sends ceil(senders / nics) times its bytes' worth of time. minipar: full
    sharding two-level across equal nodes (sharding_bytes)."""
    if dp == 1:
        return 0.0
    w = _where(dp, dp_per_node, where)
    if mode == "hybrid":
        check_shard(dp, shard)
        s, r = shard, dp // shard
        share = link_share(w.senders(s), nics)
        inside = 2 * _ring("all_gather", psi, s, w.span(s) > 1, h, share) if s > 1 else 0.0
        inside += _ring("reduce_scatter", psi, s, w.span(s) > 1, h, share) if s > 1 else 0.0
        if r == 1:
            return inside
        share = link_share(w.senders(r, s), nics)
        return inside + _ring("all_reduce", psi / s, r, w.span(r, s) > 1, h, share)
    n = w.span(dp)
    share = link_share(w.senders(dp), nics)
    g_n = w.even(dp)
    if mode == "full" and n > 1 and g_n and minipar:
        crossing = min(w.per_node, max(g_n, w.senders(dp)))  # every rank of the node
        return _two_level_sharding(psi, n, g_n, h, link_share(crossing, nics))
    if mode == "full":  # 3 rings of p-1 steps: 1.5 ring all-reduces' steps and bytes
        return 1.5 * _ring("all_reduce", psi, dp, n > 1, h, share)
    if n == 1 or not g_n:
        return _ring("all_reduce", psi, dp, n > 1, h, share)
    if nics:  # reduce-scatter inside, all-reduce of the g_n-th across (shared links), gather
        ranks = min(w.per_node, max(g_n, w.senders(dp)))
        inside = cost.predict("reduce_scatter", "ring", psi, g_n, h.intra) if g_n > 1 else 0.0
        inside += cost.predict("all_gather", "ring", psi, g_n, h.intra) if g_n > 1 else 0.0
        across = cost.predict("all_reduce", "ring", psi / g_n * link_share(ranks, nics), n, h.inter)
        if not minipar or g_n == 1:
            return inside + across
        # auto's choice: the pipelined form where its pieces overlap the phases for less
        links = g_n / link_share(ranks, nics)  # the node's crossing ranks on its links
        piped = cost.predict_on_nodes("all_reduce", "hierarchical_pipelined", psi, n, g_n,
                                      h.intra, h.inter, links)  # fmt: skip
        return min(inside + across, piped)
    two_level = cost.Hierarchy(h.intra, h.inter, g_n)
    return cost.all_reduce_on_cluster(psi, n, "hierarchical", two_level)


def _two_level_sharding(psi: float, n: int, g_n: int, h: cost.Hierarchy, share: int) -> float:
    """Full sharding's 2 all-gathers and reduce-scatter, each two-level: a ring over the g_n
    ranks inside a node, and one over the n nodes of the g_n-th of the vector, `share` of a
    node's crossing ranks on one link."""
    part, inside, across = psi / g_n * share, 0.0, 0.0
    for collective in ("all_gather", "all_gather", "reduce_scatter"):
        inside += cost.predict(collective, "ring", psi, g_n, h.intra) if g_n > 1 else 0.0
        across += cost.predict(collective, "ring", part, n, h.inter)
    return inside + across


def shared(link: cost.Link, share: int) -> cost.Link:
    """`link` as one of `share` messages sharing it sees it: share times the seconds a byte."""
    return link if share == 1 else replace(link, beta=link.beta * share)
