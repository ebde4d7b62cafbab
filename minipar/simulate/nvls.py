"""NVLink SHARP (NVLS): the all-reduce the NVSwitch computes, on the h100 and b200 presets.

Hopper's and Blackwell's NVSwitches reduce in the switch: a GPU reads its 1/p share of every
GPU's buffer already summed (multimem.ld_reduce), then writes the sum once and the switch copies
it to all p GPUs (multimem.st). What crosses one GPU's NVLink port:

    out   n (every byte of its buffer, read once by the switch) + n/p (its share of the sum)
    in    n/p (its share, summed) + n (every share, broadcast)

so a GPU's port carries n (1 + 1/p) bytes each way, at 0.85 of NCCL's 370.8 GB/s on an H100
(protocols.py). NCCL runs it as a pipeline of three warp groups a channel (src/device/
all_reduce.h, RunWorkColl<AllReduce, NVLS, Simple>, NCCL 2.30.7): scatter (the input into the
switch's buffers), reduce (ld_reduce and the multicast store), gather (the sum out), each
walking the buffer in loops of channels x heads x chunk bytes:

    loop 1:  scatter | reduce  | gather
    loop 2:            scatter | reduce  | gather        time = hop + (loops + 2) x one loop
    ...

so two loops beyond the buffer's own fill the pipe. NCCL shrinks the chunk at mid sizes
(enqueue.cc calcCollChunking: 128 KiB, down to 64, 32 and 16 KiB below 64, 8 and 2 loops of
them), which keeps that fill a large share there: 4 MiB on 8 H100 runs in loops of 2 MiB.

No rank sends a message here: the switch is hardware, so the ranks meet (the simulator's
control plane), the switch's sum is computed from their real buffers, and every clock moves to
the last arrival plus that time.
"""

from __future__ import annotations

import math

import numpy as np

from minipar.simulate.protocols import NVLS_EFFICIENCY
from minipar.state import process

# transport/nvls.cc: NVLS_NCHANNELS_SM90 16, NVLS_NCHANNELS_SM100_NVL 24 (one node) and
# NCCL_NVLS_CHUNKSIZE's default, 128 KiB
NVLS_CHANNELS = {"h100": 16, "b200": 24}
NVLS_CHUNK = 128 << 10


def all_reduce_nvls(x, seconds) -> None:
    """Sum x over the simulated world in place, as the switch would; `seconds(n_bytes, p)` is
    what the switch's all-reduce costs once every rank has arrived."""
    comm = process.world
    task = getattr(comm, "task", None)
    if task is None:
        raise RuntimeError("all_reduce_nvls runs only inside a simulated rank (simulate())")
    met = comm.allgather_object((task.clock, x.copy()))
    start = max(clock for clock, _ in met)
    total = np.sum([buf for _, buf in met], axis=0, dtype=x.dtype)
    x[...] = total
    scale = comm.group.scale
    task.clock = start + seconds(x.nbytes * scale, comm.size)


def loop_bytes(nbytes: float, channels: int, heads: int) -> int:
    """Bytes of the buffer one loop of NCCL's NVLS kernel covers: channels x heads x chunk,
    the chunk NCCL's calcCollChunking picks for nbytes (halved below 64, 8, 2 loops)."""
    chunk, ops = NVLS_CHUNK, channels * heads
    for loops, smaller in ((64, 64 << 10), (8, 32 << 10), (2, 16 << 10)):
        if nbytes < loops * ops * chunk and chunk > smaller:
            chunk = smaller
    return ops * chunk


def nvls_seconds(priced_cluster):
    """seconds(n, p) on a cluster priced for NVLS (protocols.priced(.., "nvls", "Simple", 1)):
    its NVLink alpha is the switch's hop, its beta the NVLS share of the port; the three-stage
    pipeline adds two loops of the buffer (one loop: n itself) at that rate."""
    hop, beta = priced_cluster.intra.alpha, priced_cluster.intra.beta
    channels = NVLS_CHANNELS.get(priced_cluster.name)

    def seconds(nbytes: float, p: int) -> float:
        fill = 0.0 if channels is None else 2 * min(nbytes, loop_bytes(nbytes, channels, p))
        return hop + (nbytes + fill) * (1 + 1 / p) * beta

    return seconds


# -- NVLSTree across nodes: NCCL's tuner's figure (not simulated yet) ----------------------------
#
# Across nodes NCCL also ranks NVLSTree (NVLink SHARP inside each node, a tree of the nodes'
# NVLS heads across; src/device/all_reduce.h RunWorkColl<AllReduce, NVLS_TREE, Simple>),
# where the nodes have NVLink SHARP. Its tuner's figure changed between releases (tuning.cc
# ncclTopoTuneModel): base 0, NVLink hop 25 us in both; the network hop 14 us (2.26.2, 2.28.3)
# or 20.9 (2.30.7); bandwidth a channel min(bwIntra, bwInter, halved beyond 2 nodes) with the
# all-reduce ratio 5/6 (2.26.2), or min(bwIntra x nvlsEfficiency x (c-1)/c x 2, bwInter x 2 on
# at most 2 nodes, perChMaxNVLSTreeBw) with nRanks / nsteps (2.28 on). The NVLS graph has a
# head a NIC ("NVLS Head 0..7" on 2 x 8 H100, NVIDIA/nccl-tests#319); its bandwidth is taken
# as the ring graph's 48 GB/s a channel on these nodes (search.cc sm90SpeedArrayInter's top,
# "bw 48/48" in NVIDIA/nccl#1453's log): NCCL's log of the NVLS graph was not found.
NVLS_TREE_NET_HOP_US = {"2.26": 14.0, "2.30": 20.9}
NVLS_TREE_PER_CHANNEL = {"h100": (57.7, 45.5), "b200": (96.0, 80.0)}  # perChMaxNVLSTreeBws
NVLS_GRAPH_BW = 48.0  # GB/s a channel, intra and inter (assumed: the ring graph's)


def tree_tuner_seconds(nbytes: float, p: int, cluster, version: str = "2.26") -> float | None:
    """Seconds NCCL's tuner (`version` "2.26" or "2.30") gives an NVLSTree all-reduce of
    nbytes on p ranks of `cluster`, or None where it has no NVLink SHARP or one node."""
    nodes = -(-p // cluster.per_node)
    caps = NVLS_TREE_PER_CHANNEL.get(cluster.name)
    if caps is None or nodes < 2:
        return None
    latency = 25.0 + 2 * int(math.log2(nodes)) * NVLS_TREE_NET_HOP_US[version]
    return (latency + nbytes / (1e3 * _nvls_tree_algbw(p, nodes, cluster, version))) * 1e-6


def _nvls_tree_algbw(p: int, nodes: int, cluster, version: str) -> float:
    """GB/s of algorithm bandwidth NCCL's tuner gives NVLSTree (a channel a NIC's head)."""
    c, bw_intra, bw_inter = cluster.nics, NVLS_GRAPH_BW, NVLS_GRAPH_BW
    if version == "2.26":
        return c * min(bw_intra, bw_inter if nodes <= 2 else bw_inter / 2) * 5 / 6
    intra = bw_intra * NVLS_EFFICIENCY[cluster.name] * (c - 1) / c * 2  # two operations pipelined
    inter = bw_inter * (2 if nodes <= 2 else 1)
    per_channel = min(intra, inter, NVLS_TREE_PER_CHANNEL[cluster.name][0 if nodes <= 2 else 1])
    return c * per_channel * p / (2 * (p - 1))
