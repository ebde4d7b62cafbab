"""NVLink SHARP (NVLS): the all-reduce the NVSwitch computes, on the h100 and b200 presets.

Hopper's and Blackwell's NVSwitches reduce in the switch: a GPU reads its 1/p share of every
GPU's buffer already summed (multimem.ld_reduce), then writes the sum once and the switch copies
it to all p GPUs (multimem.st). What crosses one GPU's NVLink port:

    out   n (every byte of its buffer, read once by the switch) + n/p (its share of the sum)
    in    n/p (its share, summed) + n (every share, broadcast)

NCCL pipelines the two halves, so a GPU's port carries n (1 + 1/p) bytes each way and the
all-reduce takes hop + n (1 + 1/p) / (NVLink x nvlsEfficiency) (protocols.py: 25 us and 0.85 of
370.8 GB/s on an H100). No rank sends a message here: the switch is hardware, so the ranks meet
(the simulator's control plane), the switch's sum is computed from their real buffers, and every
clock moves to the last arrival plus that time.
"""

from __future__ import annotations

import numpy as np

from minipar.state import process


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


def nvls_seconds(priced_cluster):
    """seconds(n, p) on a cluster priced for NVLS (protocols.priced(.., "nvls", "Simple", 1)):
    its NVLink alpha is the switch's hop, its beta the NVLS share of the port."""
    hop, beta = priced_cluster.intra.alpha, priced_cluster.intra.beta

    def seconds(nbytes: float, p: int) -> float:
        return hop + nbytes * (1 + 1 / p) * beta

    return seconds
