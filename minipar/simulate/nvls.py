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

import numpy as np

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
