"""NCCL's protocols and its tuner: what a (algorithm, protocol) pair costs, and the cheapest.

NCCL moves every collective with one of three protocols (Jeaugey, NCCL, GTC 2019; NCCL's
src/graph/tuning.cc and src/graph/topo.h are the public reference for the figures below):

    Simple   whole chunks, then a memory fence and a flag: the full bandwidth of the link, but
             several microseconds a hop (the fence and the flag's round trip)
    LL       "low latency": 8-byte stores, 4 bytes of data and a 4-byte flag in each, so the
             receiver polls the data itself: well under a microsecond a hop, at most half the
             bandwidth (and NCCL caps it lower: `llMaxBw`)
    LL128    128-byte lines, 120 of data and 8 of flag: LL's latency at 120/128 of the
             bandwidth (NCCL models 0.92 for the ring)

The cost NCCL's tuner gives (algorithm a, protocol p) for n bytes is

    base[a][p] + steps on NVLink x hop[NVLink][a][p] + steps across nodes x hop[net][a][p]
               + n / (bus bandwidth x efficiency[a][p] x the collective's ratio)

and it runs the cheapest pair (ncclTopoGetAlgoTime). The constants, per microsecond and GB/s,
are NCCL's defaults for Hopper and Blackwell (tuning.cc, ncclTunerConstantsDefaults):

    base latency     tree LL 6.8, LL128 14.0, Simple 8.4; ring LL 6.6, LL128 14.0, Simple 8.4;
                     NVLS 0 (its hop latency carries it)
    hop, NVLink      tree 0.6 / 1.25 / 4.0; ring 0.6 / 1.9 / 3.4; NVLS Simple 25
    hop, network     tree 5.0 / 8.5 / 14; ring 2.7 / 4.0 / 14; plus, on rings across nodes,
                     an intra-node hop of at least 1 us (3 us with Simple: the network proxy)
    bandwidth        NVLink: 20.6 GB/s a link on Hopper (18 links: 370.8 GB/s of the 450 the
                     datasheet gives, NCCL's "protocol overhead" in nccl-tests#212), 40.1 on
                     Blackwell; a NIC its line rate (400 Gb/s: 50 GB/s)
    efficiency       ring LL: half, at most llMaxBw (141 GB/s on one Hopper node; across
                     nodes of x86 Intel hosts 39 on two, 20.4 beyond); ring LL128: 0.92;
                     tree Simple 0.92, tree LL 1/3.8, tree LL128 7/9 in a node, 120/128
                     across; NVLS 0.85 of NVLink (nvlsEfficiency)
    channel caps     across nodes the tuner also caps a bus bandwidth at the graph's channels
                     (a NIC each) x a per-channel figure: ring LL128 36.7; tree 41.4 on 2
                     nodes, 36.0 beyond; tree LL128 36.7, 29.0 (GB/s, Hopper; `channel_cap`)
    plateau          a Simple ring's all-reduce across nodes pays 1.4 x its latency from 64
                     bytes a channel and rank on (`plateau`)

The caps and the plateau enter only the tuner's ranking (`nccl_time`): the simulated links keep
the protocol's share of the line rate, since the measured trees across nodes run faster than
the capped formula (4 x 8 at 16 MiB: 258-286 us measured, 287 simulated, 347 with the caps on
the links).

The simulator runs the chosen algorithm's own file with its messages priced so (`priced`): a
hop costs hop[class][a][p] and its bytes at the protocol's share of the link, and the
collective starts base[a][p] late. The tuner (`choose`) ranks the pairs by NCCL's own formula
(`nccl_time`). With no protocol the links are the cluster's as given: every closed form stays
exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from minipar.simulate.proxy import CHANNELS_PER_NIC

PROTOCOLS = ("LL", "LL128", "Simple")
US = 1e-6

# tuning.cc, ncclTunerConstantsDefaults: microseconds, [family][protocol]
BASE = {
    "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
    "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
    "nvls": {"Simple": 0.0},
}
HOP = {
    "nvlink": {
        "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
        "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
        "nvls": {"Simple": 25.0},
    },
    "pci": {
        "tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0},
        "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
    },
    "net": {
        "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
        "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
        "nvls": {"Simple": 18.0},
    },
}
NET_OVERHEAD_US = 1.0  # getNetOverhead on x86 Intel: a ring's intra-node hop across nodes
# No start-up cost across nodes beyond the tuner's: a healthy pair of 8 H100 with 8 NDR NICs
# (NVIDIA/nccl-tests#309, NCCL 2.26.2) all-reduces 8 B to 128 B in 24.7-25.7 us, the tuner's
# own 25.2 (tree LL: 6.8 + 2 (7 x 0.6 + 5.0)), and 4 nodes in 34.5-35.0 us against its 35.2.
# (An earlier round added 36.4 us fitted to NVIDIA/nccl#1453's 61.6 us at 128 B: a cluster that
# issue was diagnosing, 2.4x that healthy pair; published.py keeps it, not held.)
# Trees are slower than the tuner's formula at mid sizes, and NCCL says so: its
# treeCorrectionFactor (tuning.cc, ncclTopoGetAlgoTime) scales a tree all-reduce's bandwidth by
# a factor a power of two of bytes / 64 (64 B .. 256 MiB), per protocol, LL / LL128 / Simple.
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5,
           .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6,
              .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
               .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}  # fmt: skip
# llMaxBws (GB/s): one node by GPU (Hopper 141, Blackwell 2 x 141); across nodes by CPU (x86
# Intel, as in a DGX: 39 on two nodes, 20.4 beyond)
LL_MAX_BW_NODE = {"h100": 141.0, "b200": 282.0}
LL_MAX_BW_NET = {2: 39.0, 3: 20.4}
NVLINK_LINK_BW = {"h100": 20.6, "b200": 40.1}  # topo.h SM90_NVLINK_BW, SM100_NVLINK_BW (GB/s)
NVLINKS = 18  # NVLink 4 and 5 GPUs: 18 links each (H100 SXM, B200 datasheets)
NVLS_EFFICIENCY = {"h100": 0.85, "b200": 0.74}  # tuning.cc nvlsEfficiency: Hopper, Blackwell
# the data's share of the bytes a protocol puts on a wire: LL stores 4 bytes of flag with every
# 4 of data, LL128 8 with every 120 (src/device/prims_ll.h, prims_ll128.h)
WIRE_SHARE = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}
PER_CHANNEL_LL128 = 36.7  # perChMaxRingLL128Bws, Hopper (GB/s a channel)
# NCCL's tuner caps a bus bandwidth across nodes at the graph's channels x a per-channel
# figure (tuning.cc ncclTopoTuneModel: perChMaxRingLL128Bws, perChMaxTreeBws,
# perChMaxTreeLL128Bws; GB/s, on 2 nodes / on more; Hopper's the same in 2.26.2 and 2.30.7,
# Blackwell's 2.30.7's). The graph runs a channel a NIC where
# every GPU has its NIC (an 8-NIC H100 node logs "Pattern 4, nChannels 8, bw 48/48"), and the
# trees are searched for the rings' channel count (search.cc ncclTopoCompareGraphs).
PER_CHANNEL_NET = {
    "h100": {"ring LL128": (36.7, 36.7), "tree": (41.4, 36.0), "tree LL128": (36.7, 29.0)},
    "b200": {"ring LL128": (40.0, 40.0), "tree": (42.8, 24.0), "tree LL128": (31.67, 20.0)},
}

# which protocol family each simulated algorithm is priced as
FAMILY = {
    "ring": "ring",
    "rings": "ring",
    "rabenseifner": "ring",
    "tree": "tree",
    "double_tree": "tree",
    "hierarchical": "tree",
    "nccl_tree": "tree",
    "nvls": "nvls",
}


def nvlink_rate(cluster) -> float:
    """Bytes/s NCCL counts on a GPU's NVLink: its per-link figure x 18 (not the datasheet)."""
    per_link = NVLINK_LINK_BW.get(cluster.name)
    if per_link is None:
        return 1 / cluster.intra.beta  # no NCCL figure for this link: its own rate
    return per_link * NVLINKS * 1e9


def efficiency(family: str, protocol: str, cluster, nodes: int) -> tuple[float, float]:
    """(NVLink share, network share) of the line rate the protocol moves data at."""
    nvlink = nvlink_rate(cluster) * cluster.intra.beta  # Simple's share of the datasheet
    if family == "nvls":
        return nvlink * NVLS_EFFICIENCY.get(cluster.name, 0.85), 1.0
    factor = {
        ("ring", "Simple"): 1.0,
        ("ring", "LL"): 0.5,
        ("ring", "LL128"): 0.92,
        ("tree", "Simple"): 0.92,
        ("tree", "LL"): 1 / 3.8,
        ("tree", "LL128"): 7 / 9 if nodes == 1 else 120 / 128,
    }[family, protocol]
    intra, inter = nvlink * factor, factor
    if protocol == "LL":  # llMaxBw caps the collective's bus bandwidth
        if nodes == 1:
            cap = LL_MAX_BW_NODE.get(cluster.name, 141.0) * 1e9
        else:
            cap = LL_MAX_BW_NET[min(nodes, 3)] * 1e9
        intra = min(intra, cap * cluster.intra.beta)
        if nodes > 1:
            inter = min(inter, cap * cluster.inter.beta / cluster.nics)
    return intra, inter


def channel_cap(family: str, protocol: str, cluster, nodes: int) -> float:
    """Bytes/s NCCL's tuner allows (family, protocol) across nodes at most: the graph's
    channels (a NIC each) x its per-channel figure; the tree's LL128 under both of its caps,
    its other protocols under the tree's (tuning.cc applies the tree's cap, then LL128's)."""
    caps = PER_CHANNEL_NET.get(cluster.name)
    if caps is None or nodes < 2 or family == "nvls":
        return float("inf")
    at, channels = (0 if nodes <= 2 else 1), cluster.nics
    if family == "ring":
        return channels * caps["ring LL128"][at] * 1e9 if protocol == "LL128" else float("inf")
    cap = channels * caps["tree"][at] * 1e9
    if protocol == "LL":
        cap /= 3.8
    elif protocol == "LL128":
        cap = min(cap * 120 / 128, channels * caps["tree LL128"][at] * 1e9)
    return cap


def intra_hw(cluster) -> str:
    """The link class NCCL's latencies are given for inside this cluster's nodes."""
    return "pci" if cluster.intra.name.startswith("pcie") else "nvlink"


def hop(family: str, protocol: str, nodes: int, hw: str = "nvlink") -> tuple[float, float]:
    """(seconds a hop inside a node, seconds a hop across nodes) for this pair."""
    intra = HOP[hw][family][protocol]
    if nodes > 1 and family == "ring":  # the proxy's post on every step of a ring across nodes
        intra = max(intra, NET_OVERHEAD_US * (3 if protocol == "Simple" else 1))
    return intra * US, HOP["net"][family][protocol] * US


def tree_correction(protocol: str, nbytes: float | None) -> float:
    """NCCL's factor on a tree all-reduce's bandwidth at this size (1 outside 64 B .. 256 MiB
    and where no size is given): index log2(bytes / 64), as tuning.cc's log2i (a floor)."""
    if nbytes is None or nbytes < 64:
        return 1.0
    index = (int(nbytes) >> 6).bit_length() - 1
    factors = TREE_CORRECTION[protocol]
    return factors[index] if index < len(factors) else 1.0


@dataclass(frozen=True)
class Priced:
    """A cluster whose links are priced for one (algorithm, protocol), and the start delay."""

    cluster: object
    base: float  # seconds before the first message: NCCL's base latency (launch included)
    family: str
    protocol: str


def priced(
    cluster, algorithm: str, protocol: str, nodes: int, launch: float = 0.0, nbytes=None
) -> Priced:
    """The cluster as `algorithm` sees it under `protocol`: each link's alpha the pair's hop
    latency, its beta the line rate's share the protocol moves (a tree's scaled by NCCL's
    correction for `nbytes`), and a base latency."""
    family = FAMILY.get(algorithm)
    if family is None:
        raise ValueError(f"no NCCL protocol model for algorithm {algorithm!r}")
    if protocol not in BASE[family]:
        raise ValueError(
            f"--protocol {protocol!r} does not run {algorithm}: choose {', '.join(BASE[family])}"
        )
    e_intra, e_inter = efficiency(family, protocol, cluster, nodes)
    if family == "tree":
        factor = tree_correction(protocol, nbytes)
        e_intra, e_inter = e_intra * factor, e_inter * factor
    a_intra, a_inter = hop(family, protocol, nodes, intra_hw(cluster))
    intra = replace(cluster.intra, alpha=a_intra, beta=cluster.intra.beta / e_intra, gamma=0.0)
    inter = replace(cluster.inter, alpha=a_inter, beta=cluster.inter.beta / e_inter, gamma=0.0)
    base = BASE[family][protocol] * US + launch
    return Priced(replace(cluster, intra=intra, inter=inter), base, family, protocol)


def flow_level_rings(cluster, nodes: int) -> object:
    """The cluster a ring of NCCL's channels sees as one ring (rings.py): every step moves all
    channels' bytes at once, (c-1)/c of them over the GPU's NVLink and 1/c over its NIC, so a
    step costs the slower of the two shares (the ports shared fairly, no turns)."""
    c = cluster.nics
    if nodes == 1 or c == 1:  # one node, or one channel: the ring as it is
        return cluster
    beta = max((c - 1) / c * cluster.intra.beta, cluster.inter.beta / c)
    return replace(
        cluster,
        intra=replace(cluster.intra, beta=beta),
        inter=replace(cluster.inter, beta=beta),
    )


def flow_level_trees(cluster, nodes: int) -> object:
    """The cluster NCCL's two trees see across nodes (nccl_tree.py): their heads are two GPUs
    of a node, but NCCL runs its trees on channels spread over all of the node's NICs, so the
    two heads' NICs stand for all of them: each carries nics / 2 NICs' rate."""
    if nodes == 1 or cluster.nics < 2:
        return cluster
    inter = replace(cluster.inter, beta=cluster.inter.beta * 2 / cluster.nics)
    return replace(cluster, inter=inter)


# -- NCCL's tuner: its own formula, to rank the pairs --------------------------------------------

STEPS = {"all_reduce": lambda p: 2 * (p - 1), "all_gather": lambda p: p - 1}
STEPS["reduce_scatter"] = STEPS["all_gather"]


def nccl_time(collective: str, algorithm: str, protocol: str, nbytes: float, p: int, cluster):
    """Seconds NCCL's tuner predicts (ncclTopoGetAlgoTime), or None where NCCL does not run
    the pair: trees only all-reduce, NVLS needs NVLink SHARP (h100, b200) on one node here."""
    nodes = -(-p // cluster.per_node)
    family = FAMILY[algorithm]
    if protocol not in BASE[family] or p == 1:
        return None
    if family == "tree" and collective != "all_reduce":
        return None
    if family == "nvls" and (cluster.name not in NVLS_EFFICIENCY or nodes > 1 or p < 3):
        return None
    steps = STEPS[collective](p)
    e_intra, e_inter = efficiency(family, protocol, cluster, nodes)
    a_intra, a_inter = hop(family, protocol, nodes, intra_hw(cluster))
    bus = e_intra / cluster.intra.beta
    if nodes > 1:  # a GPU's NVLink carries (c-1)/c of a ring step, its NIC 1/c (channels)
        c = cluster.nics
        nvlink = bus * c / (c - 1) if c > 1 else float("inf")
        cap = channel_cap(family, protocol, cluster, nodes)
        bus = min(nvlink, e_inter * c / cluster.inter.beta, cap)
    if family == "ring":
        inter_steps = 0 if nodes == 1 else (2 if collective == "all_reduce" else 1) * (nodes - 1)
        latency = (steps - inter_steps) * a_intra + inter_steps * a_inter
        algbw = bus * p / steps
    elif family == "tree":
        local = p // nodes - 1
        latency = 2 * (local * a_intra + int(math.log2(nodes)) * a_inter)
        algbw = bus * 0.5 * tree_correction(protocol, nbytes)
    else:  # NVLS: reduce-scatter and all-gather through the switch, pipelined (x2)
        latency = a_intra
        # tuning.cc (2.27 on) takes (c-1)/c of the NVLink, c the NVLS graph's channels: one a
        # GPU of the node (search.cc); all-gather and reduce-scatter also (p-1)/p
        share = (p - 1) / p
        algbw = bus * share * (2 * p / steps if collective == "all_reduce" else share)
    latency += BASE[family][protocol] * US
    if plateau(collective, family, protocol, nbytes, p, cluster, nodes):
        latency *= PLATEAU
    return latency + nbytes / algbw


PLATEAU = 1.4  # ncclTopoGetAlgoTime: a multi-node Simple ring's latency, compute capability 8+


def plateau(collective, family, protocol, nbytes, p, cluster, nodes) -> bool:
    """NCCL's "plateau effect of ring" (tuning.cc ncclTopoGetAlgoTime, 2.26.2 and 2.30.7): an
    all-reduce by the Simple ring across nodes pays 1.4 x its latency once every channel's
    share of a rank is 64 bytes or more (the communicator's channels: 2 a NIC, proxy.py)."""
    if (collective, family, protocol) != ("all_reduce", "ring", "Simple") or nodes < 2:
        return False
    return nbytes / (CHANNELS_PER_NIC * cluster.nics * p) >= 64


CANDIDATES = {
    "all_reduce": ("ring", "double_tree", "nvls"),
    "all_gather": ("ring", "nvls"),
    "reduce_scatter": ("ring", "nvls"),
}


def choose(collective: str, nbytes: float, p: int, cluster, algorithms=None):
    """NCCL's pick for this size: the (algorithm, protocol) its formula says is cheapest."""
    best = None
    for algorithm in algorithms or CANDIDATES[collective]:
        for protocol in PROTOCOLS:
            t = nccl_time(collective, algorithm, protocol, nbytes, p, cluster)
            if t is not None and (best is None or t < best[0]):
                best = (t, algorithm, protocol)
    if best is None:
        raise ValueError(f"no NCCL algorithm runs {collective} on {p} ranks of {cluster.name}")
    return best[1], best[2]
