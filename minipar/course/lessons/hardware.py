"""The real hardware the lessons reason about: GPU memory sizes and the links between GPUs.

Bandwidths are per direction unless a name says "total": a ring sends and receives at once, so
the cost model's beta is 1 / (one direction's bandwidth). The seed's figures for a B200 are
NVLink 5 at 1.8 TB/s (both directions together, 900 GB/s each way) and HBM3e at 8 TB/s.
The links themselves (alpha, beta, gamma, with sources) are minipar.cost's presets; this file
adds the memory sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from minipar import cost


@dataclass(frozen=True)
class GPU:
    name: str
    hbm_bytes: float  # memory capacity
    hbm_rate: float  # memory bandwidth, bytes/s
    nvlink_total: float  # NVLink bandwidth per GPU, both directions together, bytes/s
    source: str


GPUS = [
    GPU("H100 SXM", 80e9, 3.35e12, 900e9, "NVIDIA H100 datasheet"),
    GPU("H200 SXM", 141e9, 4.8e12, 900e9, "NVIDIA H200 datasheet"),
    GPU("B200", 192e9, 8e12, 1.8e12, "the seed (NVLink 5 1.8 TB/s, HBM 8 TB/s); B200 datasheet"),
]
B200 = GPUS[-1]


def link(name: str) -> cost.Link:
    """A link preset of minipar.cost by name: hbm3e, nvlink5, nvlink4, pcie5, ib_ndr, ..."""
    return cost.PRESETS[name]


def rate(link_: cost.Link) -> float:
    """Per-direction bandwidth of a link, bytes/s."""
    return 1 / link_.beta
