"""Published all-reduce bus bandwidths the simulator is held to (docs/simulate.md cites each).

Each entry: the cluster preset, nodes, the algorithm minipar runs for it, the message size, the
busbw nccl-tests reported at large sizes (GB/s), and where the figure is from. The simulated
busbw must fall within TOLERANCE of it (tests/test_simulate.py). On one node NCCL's ring is
minipar's ring; across nodes NCCL runs one ring per NIC at once (its channels), which is
minipar's "rings" (rings.py: the unchanged ring.py on 8 groups).
"""

from __future__ import annotations

TOLERANCE = 0.25

NCCL_TESTS = [
    {
        "cluster": "h100",
        "nodes": 1,
        "algorithm": "ring",
        "bytes": 1 << 30,
        "busbw_GBps": 370.0,
        "source": "NCCL's maintainer, NVIDIA/nccl-tests#212: NVLink 4's 450 GB/s line rate "
        "less ~20% protocol overhead, 370 GB/s busbw with NCCL_ALGO=RING on 8 H100",
    },
    {
        "cluster": "h100",
        "nodes": 2,
        "algorithm": "rings",
        "bytes": 1 << 30,
        "busbw_GBps": 370.0,
        "source": "NVIDIA/nccl-tests#290 (an NCCL developer): 46-48 GB/s per NDR 400 Gb/s "
        "NIC with the ring across nodes, so 8 NICs a node give 370-385 GB/s busbw",
    },
    {
        "cluster": "h100",
        "nodes": 4,
        "algorithm": "rings",
        "bytes": 1 << 30,
        "busbw_GBps": 380.0,
        "source": "as above, 4 nodes",
    },
    {
        "cluster": "h100",
        "nodes": 16,
        "algorithm": "rings",
        "bytes": 1 << 30,
        "busbw_GBps": 380.0,
        "source": "as above, 16 nodes (too slow for the suite: measured in docs/simulate.md)",
    },
]
