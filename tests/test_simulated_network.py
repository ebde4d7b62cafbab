"""The simulated network priced from outside the simulator (minipar/simulate/): the presets'
links against their datasheets' figures written here, channels of unequal length run at once
(a rank ends with the latest, whichever was started last), and a group's own byte scale on a
link that costs something per byte."""

from __future__ import annotations

import numpy as np
import pytest

import minipar
from minipar.cost.links import Link
from minipar.simulate import cluster as clusters
from minipar.simulate.network import Network
from minipar.simulate.runner import concurrently, group, simulate

# Bytes per second in one direction, from the datasheets (not from minipar.cost.links):
PCIE5_X16 = 32e9 * 16 * 128 / 130 / 8  # 32 GT/s a lane, 16 lanes, 128b/130b coding: 63.0 GB/s
NVLINK4 = 900e9 / 2  # H100 SXM: 900 GB/s per GPU, both directions together
NVLINK5 = 1.8e12 / 2  # B200: 1.8 TB/s per GPU, both directions together
NDR = 400e9 / 8  # InfiniBand NDR (ConnectX-7): 400 Gb/s a port

DATASHEETS = [("pcie", PCIE5_X16, NDR), ("h100", NVLINK4, NDR), ("b200", NVLINK5, NDR)]


@pytest.mark.parametrize("name,inside,between", DATASHEETS, ids=[d[0] for d in DATASHEETS])
def test_a_presets_messages_take_the_datasheets_time(name, inside, between):
    """1 GB inside a node and 1 GB to the next node, each alone on its ports: n / bandwidth
    (the latency, microseconds, is far below the 2% allowed; PCIe's preset rounds 63 up to 64)."""
    cluster, n = clusters.preset(name), 1e9
    net = Network(cluster, 2 * cluster.per_node)
    assert net.send(0, 1, n, 0.0) == pytest.approx(n / inside, rel=0.02), "inside a node"
    across = net.send(0, cluster.per_node, n, 0.0)
    assert across == pytest.approx(n / between, rel=0.02), "between nodes"


ALPHA, BETA = 5e-6, 1e-9  # 1 GB/s: a byte costs something
SHAPED = clusters.custom(Link("shaped", ALPHA, BETA, 0.0), 4)


def test_unequal_channels_at_once_end_with_the_longest():
    """Rank 0 sends 8 MB to rank 1 and, at the same time, receives 8 kB from rank 2 (other
    ports: neither waits for the other). Listed long first, then short, and the other way:
    rank 0's clock ends at the long one's arrival, n beta + alpha, either way."""
    long_bytes, short_bytes = 8e6, 8e3

    def step(rank, order):
        big, small = np.zeros(int(long_bytes) // 8), np.zeros(int(short_bytes) // 8)
        if rank == 0:
            thunks = {
                "long": lambda: minipar.send(big, 1),
                "short": lambda: minipar.recv(small, 2),
            }
            concurrently([thunks[name] for name in order])
        elif rank == 1:
            minipar.recv(big, 0)
        elif rank == 2:
            minipar.send(small, 0)

    for order in (("long", "short"), ("short", "long")):
        run = simulate(lambda rank, order=order: step(rank, order), 3, SHAPED)
        assert run.clocks[0] == pytest.approx(long_bytes * BETA + ALPHA, rel=1e-12), order
        assert run.clocks[2] == pytest.approx(short_bytes * BETA + ALPHA, rel=1e-12)


def test_a_groups_own_byte_scale_prices_its_messages():
    """The world stands 10 simulated bytes for each real one, a group of its own 1000: a
    message of 80 real bytes costs alpha + 800 beta on the world, alpha + 80,000 beta on the
    group (one after the other on rank 1's clock)."""
    x = np.zeros(10)  # 80 bytes

    def step(rank):
        if rank >= 2:
            return None
        minipar.send(x, 1) if rank == 0 else minipar.recv(x, 0)  # the world: scale 10
        g = group([0, 1], scale=1000.0)
        g.send(x, 1, 0) if rank == 0 else g.recv(x, 0, 0)
        return minipar.get_rank()

    run = simulate(step, 3, SHAPED, scale=10.0)
    world_message, group_message = ALPHA + 800 * BETA, ALPHA + 80_000 * BETA
    assert run.clocks[1] == pytest.approx(world_message + group_message, rel=1e-12)
    assert run.bytes == pytest.approx(800 + 80_000)


def test_a_post_floor_delays_the_next_message_on_the_nic_not_the_first():
    """NCCL's proxy posts one chunk at a time (simulate/proxy.py): a message across nodes holds
    its NIC out for `post` seconds at least, yet arrives n beta + alpha after it starts."""
    cluster = clusters.custom(Link("shaped", ALPHA, BETA, 0.0), 4).with_per_node(2)
    post, n = 20e-6, 1e3  # 1 us of bytes, a 20 us post
    net = Network(cluster, 4, post=post)
    first = net.send(0, 2, n, 0.0)
    assert first == pytest.approx(n * BETA + ALPHA), "the first message: the wire's time"
    second = net.send(0, 2, n, 0.0)
    assert second == pytest.approx(post + n * BETA + ALPHA), "the next waits for the post"
    inside = net.send(0, 1, n, 0.0)
    assert inside == pytest.approx(n * BETA + ALPHA), "NVLink messages take no post"


def test_streamed_hops_inside_a_node_cut_through_and_the_network_hop_stores():
    """NCCL's LL128 forwards each 128-byte line as its flag lands (prims_ll128.h): a chain of
    k hops of n bytes inside a node ends at n beta + k alpha + (k - 1) 128 beta, not
    k (n beta + alpha). A message to another node lands whole at the wire's pace (`wire`),
    while its NIC stays held at the link's own (slower, priced) rate for the next message."""
    cluster = clusters.custom(Link("shaped", ALPHA, BETA, 0.0), 4).with_per_node(3)
    n, wire = 1e6, BETA / 4  # 1 ms of bytes inside; the wire 4x the priced rate across
    net = Network(cluster, 6, stream=True, wire=wire)
    t = 0.0
    for src in (0, 1):  # 0 -> 1 -> 2, each forwarding from its first line
        t = net.send(src, src + 1, n, t)
        assert t == pytest.approx(net.whole - n * BETA + 128 * BETA), "acts on the first line"
    assert net.whole == pytest.approx(n * BETA + 2 * ALPHA + 128 * BETA), "cut through"
    across = net.send(3, 0, n, 0.0)
    assert across == pytest.approx(n * wire + ALPHA), "across nodes: whole, at the wire's pace"
    after = net.send(3, 1, n, 0.0)
    assert after == pytest.approx(n * BETA + n * wire + ALPHA), "the NIC held at its own rate"
