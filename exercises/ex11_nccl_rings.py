# Generated from solutions/ex11_nccl_rings.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 11`.
# The grader admits these imports here (others it refuses, naming the line):
#   none of minipar's
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 11, one ring per NIC (lesson 11: at scale).

One ring over p ranks on several nodes crosses each node boundary once, so it runs at one
NIC's rate. NCCL opens channels instead: c rings over the same ranks at once, each carrying 1/c
of the buffer, ring c entering every node at local rank c and leaving it from local rank c - 1,
so each of a node's NICs (one per GPU) carries one ring's crossing:

    per_node = 4, 2 nodes, channel 1:   1 2 3 0 | 5 6 7 4     (then back to rank 1)

Write `ring_orders(size, per_node, channels)`: for each channel c, the world ranks of its ring
in ring order: node by node, and inside node k the ranks k*per_node + (c + j) mod per_node for
j = 0 .. per_node - 1 (a last node may be partial: leave out ranks >= size). Raise ValueError
naming the bad value when channels is not between 1 and per_node.

The grader checks the orders for several shapes, that every ring holds every rank once, that the
channels leave each node through different GPUs (different NICs), and, on a simulated cluster of
two DGX H100 nodes (minipar.simulate), that the unchanged ring all-reduce on your rings reaches
more than five times one ring's bus bandwidth and the exact sum on every rank. Ring c is the
c-th list you return; it leaves node 0 through the NIC of its last GPU there (the rank before it
crosses to node 1). A failure names the shape, the ring and both NICs, yours beside the
reference's.

Grade it: minipar grade 11
"""


def ring_orders(size: int, per_node: int, channels: int) -> list[list[int]]:
    """The world ranks of each channel's ring, in ring order."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
