"""Several rings at once, one per NIC: how NCCL's ring all-reduce fills a node's network.

One ring over p ranks on m nodes crosses each node boundary once, so it runs at one NIC's rate
(50 GB/s on NDR) however many NICs a node has. NCCL opens channels: c rings over the same
ranks, each given 1/c of the buffer, ring c entering every node at local rank c and leaving it
from local rank c - 1, so each of a node's NICs carries one ring's crossing (Jeaugey, NCCL,
GTC 2019). Here each channel is a group of its own and the unchanged ring.py all-reduces its
share; the channels run at the same time: each starts at the same clock, and the ports they
share (every GPU's NVLink port) carry their messages in turn (network.py).

    ring c:   node 0: c, c+1, .., c-1  ->  node 1: c, c+1, .., c-1  ->  ...  -> back to node 0

A node's bytes across the network: 2 (p-1)/p n over c NICs at once, so the bus bandwidth tends
to min(NVLink, c x NIC) = min(450, 8 x 50) = 400 GB/s on a DGX H100 (nccl-tests: about 370).
"""

from __future__ import annotations

from minipar import runtime
from minipar.collectives import api, layout
from minipar.simulate.runner import concurrently


def ring_orders(size: int, per_node: int, channels: int) -> list[list[int]]:
    """The world ranks of each channel's ring, in ring order."""
    # BEGIN ANSWER ex11_nccl_rings
    if not 1 <= channels <= per_node:
        raise ValueError(f"channels must be between 1 and per_node = {per_node}, got {channels}")
    nodes = -(-size // per_node)
    orders = []
    for c in range(channels):
        order = []
        for node in range(nodes):
            local = [(c + j) % per_node for j in range(per_node)]
            order += [node * per_node + q for q in local if node * per_node + q < size]
        orders.append(order)
    return orders
    # END ANSWER


def ring_groups(size: int, per_node: int, channels: int) -> list:
    """Every rank calls it: one group per channel (new_group, in ring order)."""
    return [runtime.new_group(order) for order in ring_orders(size, per_node, channels)]


def all_reduce_rings(x, groups) -> None:
    """All-reduce x in place: its c-th part on channel c's ring, the channels at once."""
    edges = layout.bounds(len(x), len(groups))
    parts = [layout.chunk(x, edges, c) for c in range(len(groups))]
    concurrently(
        [
            lambda part=part, g=g: api.all_reduce(part, group=g, algorithm="ring")
            for part, g in zip(parts, groups)
        ]
    )
