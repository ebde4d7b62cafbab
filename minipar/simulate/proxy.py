"""NCCL's proxy thread across nodes: one network post a chunk, one after another.

A GPU never touches the NIC itself. NCCL runs one proxy thread a rank (src/proxy.cc,
ncclProxyProgress) that watches every channel's buffer slots and, once the kernel has filled a
slot, posts it to the network as one send (src/transport/net.cc, sendProxyProgress: an LL128
slot is sent once every line of it carries its flag, so a network hop stores and forwards
whole chunks). NCCL's tuner prices a post at 1 us on Intel x86 hosts, 2 on AMD
(src/graph/tuning.cc, getNetOverhead, "network post overhead"). How many posts a collective
makes is NCCL's chunking (src/enqueue.cc, NCCL 2.26.2; the same in 2.30.7):

    channels   the communicator's nc (two per NIC on a DGX: connect.cc doubles the search's
               one a NIC; nccl#1453 logs 16 on 8 NICs), cut while bytes < nc x threads x
               threadThreshold (topoGetAlgoInfo: LL 512 x 8, LL128 640 x 8, Simple 512 x 64)
    chunk      a slot (the protocol's buffer / NCCL_STEPS; LL carries half of it, LL128 15 of
               16 words), the LL128 tree's shrunk while a channel's share is under
               (1 + log2 nodes + 0.1 ppn) x 64 / ppn chunks (down to 128 KiB), then x 16 / ppn
               (down to 32 KiB): calcCollChunking
    loops      chunks a channel moves: bytes / (channels x chunk), rounded up

so a tree's head GPU posts loops chunks a direction for each channel it heads (channels / NICs).
At 4 MiB on 4 x 8 H100 that is 16 chunks of 17 KB a channel, 32 posts (32 us) where the wire
needs 10: mid sizes across nodes are the proxy's, not the link's. The simulator charges it as a
floor on the sending NIC port: a message holds the port at least its share of those posts
(`post_seconds`), its bytes still arrive at the wire's pace (network.py), so one chunk alone
(small sizes) costs nothing more than the tuner's latency.
"""

from __future__ import annotations

import math

STEPS = 8  # NCCL_STEPS: slots a connection's buffer holds
BUFFER = {  # bytes a connection's buffer holds (init.cc DEFAULT_*_BUFFSIZE)
    "LL": 8 * 512 * STEPS * 16,  # NCCL_LL_LINES_PER_THREAD x LL_MAX_NTHREADS x 16-byte lines
    "LL128": 120 * 640 * STEPS * 8,  # LL128_ELEMS_PER_THREAD x LL128_MAX_NTHREADS x 8 bytes
    "Simple": 4 << 20,
}
THREADS = {"LL": 512, "LL128": 640, "Simple": 512}  # maxThreads (tuning.cc), the tree's
THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}  # NCCL_*_THREAD_THRESHOLD (comm.h)
GRAIN = {"LL": 16, "LL128": 1920, "Simple": 512}  # ncclProtoGrainSize (device.h), bytes
POST_US = 1.0  # getNetOverhead, x86 Intel (a DGX's hosts)
CHANNELS_PER_NIC = 2  # connect.cc: the search's channels, one a NIC, doubled


def tree_channels(nbytes: float, protocol: str, nics: int) -> int:
    """The channels NCCL's tree runs for nbytes (topoGetAlgoInfo's cut)."""
    nc = CHANNELS_PER_NIC * nics
    while nc > 1 and nbytes < nc * THREADS[protocol] * THRESHOLD[protocol]:
        nc -= 1
    return nc


def tree_chunk(nbytes: float, protocol: str, channels: int, nodes: int, ppn: int) -> int:
    """Bytes of a chunk of NCCL's tree for nbytes on `channels` (calcCollChunking)."""
    chunk = BUFFER[protocol] // STEPS
    if protocol == "LL":
        chunk //= 2  # 8 bytes a line: 4 of data
    if protocol == "LL128":
        chunk = chunk // 16 * 15  # 128 bytes a line: 120 of data
        steps = 1 + int(math.log2(nodes)) + 0.1 * ppn
        for depth, floor in ((64, 128 << 10), (16, 32 << 10)):
            while nbytes // (channels * chunk) < steps * depth / ppn and chunk > floor:
                chunk //= 2
    return chunk // GRAIN[protocol] * GRAIN[protocol]


def tree_posts(nbytes: float, protocol: str, nodes: int, ppn: int, nics: int) -> tuple:
    """(channels, chunk bytes, loops a channel, posts a head GPU makes a direction)."""
    nc = tree_channels(nbytes, protocol, nics)
    chunk = tree_chunk(nbytes, protocol, nc, nodes, ppn)
    loops = max(1, -(-int(nbytes) // (nc * chunk)))
    return nc, chunk, loops, loops * max(1, -(-nc // nics))


def post_seconds(nbytes: float, protocol: str, nodes: int, ppn: int, nics: int, pieces: int):
    """Seconds each of a simulated tree's `pieces` network messages holds its sender's NIC at
    least: the head GPU's posts a direction, spread over the pieces that stand for them. One
    chunk a channel costs nothing more: the tuner's network hop latency has its post in it."""
    if nodes < 2:
        return 0.0
    _, _, loops, posts = tree_posts(nbytes, protocol, nodes, ppn, nics)
    return 0.0 if loops == 1 else POST_US * 1e-6 * posts / pieces
