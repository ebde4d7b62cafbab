"""Two-level collectives: the heavy traffic inside the node, a k-th of it between nodes.

A group of N nodes with k ranks each (runtime/nodes.py says which rank is where). A flat ring
over all p = N k ranks crosses between nodes at every node boundary, and each of its 2 (p-1)
steps waits for its slowest hop: the node's link carries 2 (p-1)/p S of an S-byte all-reduce.
Two levels (Horovod's hierarchical all-reduce; NCCL's rings and MPICH's smp-aware collectives
share the idea) keep the ring pieces of ring.py and run them on two kinds of sub-group:

    inside   the k ranks of my node                 node 0: ranks 0 1   node 1: ranks 2 3
    across   the N ranks at my position, one a node          across 0: 0 2   across 1: 1 3

    all-reduce = reduce-scatter inside (local rank j owns chunk j of the node's sum),
                 all-reduce of chunk j across (the k "across" rings run at once),
                 all-gather inside.

Per rank (S bytes, n = S / p one rank's block):

    collective      inside the node                 between nodes                steps
    all-reduce      2 (k-1)/k S                     2 (N-1)/N S/k                2(k-1) + 2(N-1)
    reduce-scatter  (k-1)/k S                       (N-1)/N S/k                  (k-1) + (N-1)
    all-gather      (k-1)/k S                       (N-1) n                      (N-1) + (k-1)
    broadcast       S (a leader forwards)           S (a leader forwards)        two pipelines

against 2 (p-1) steps for the flat ring all-reduce. The k ranks of a node cross at once, so the
node's link carries 2 (N-1)/N S for an all-reduce (a flat ring: 2 (p-1)/p S, 1.5x more on
2 x 2) in 2 (N-1) slow steps instead of 2 (p-1). All-gather and reduce-scatter save less: the
node's link carries k (N-1) n instead of (p-1) n, in N-1 slow steps instead of p-1. Broadcast
pays against a tree, whose root sends every step over whatever link; it sends what a flat chain
sends (each node receives S once) in two pipelines, one per level.

The levels are views of the one call (`Level`): no sub-communicator is made (node_groups' splits
are collective: made inside a call, on a torch sub-group or the progress thread, they could
hang), the messages carry the call's tag, the ledger sees one call whose steps run on through
the levels, and each message knows whether it crossed between nodes (comm/trace/ledger.py).
Measured on 2 emulated nodes of 2 on a 2 Gbit/s link (`minipar bench all_reduce -n 4 --nodes
2 --fit`): 64 MiB in 345 ms against the flat ring's 510 and MPI_Allreduce's 632 (78% of the
link's 268 ms floor), the model within +23%. Results: every all-reduce chunk is
reduced inside a node, then by a ring across nodes, then copied, so all ranks end bitwise
identical; the order of the sum differs from the flat ring's (equal for integers, MIN, MAX).

On one node each collective is the ring alone (bitwise what algorithm="ring" gives). Nodes of
unequal size (5 ranks as 3 + 2) have no common position to pair ranks by: all-reduce,
reduce-scatter and all-gather fall back to the flat ring, correct and priced as such; broadcast
needs only one leader a node, and runs two-level on any sizes.
"""

from __future__ import annotations

from minipar.collectives import layout, ring, workspace
from minipar.comm.transport import buffers
from minipar.runtime import nodes
from minipar.state import process


class Level:
    """The ranks `ranks` (group ranks) of a running call, numbered 0..len-1: an algorithm
    written against a Call runs on them unchanged, and its messages are the call's."""

    def __init__(self, call, ranks: list[int], name: str, first_step: int = 0):
        self.call, self.ranks, self.name = call, ranks, name
        self.rank, self.size = ranks.index(call.rank), len(ranks)
        self.first_step = first_step  # what an algorithm that sets `step` itself counts from

    @property
    def step(self) -> int:
        return self.call.step - self.first_step

    @step.setter
    def step(self, value: int) -> None:
        self.call.step = self.first_step + value

    def rounds(self, n: int):
        return self.call.rounds(n)

    def send(self, buf, dst: int) -> None:
        self.call.send(buf, self.ranks[dst])

    def recv(self, buf, src: int) -> None:
        self.call.recv(buf, self.ranks[src])

    def sendrecv(self, sendbuf, dst: int, recvbuf, src: int) -> None:
        self.call.sendrecv(sendbuf, self.ranks[dst], recvbuf, self.ranks[src])

    def isend(self, buf, dst: int):
        return self.call.isend(buf, self.ranks[dst])

    def irecv(self, buf, src: int):
        return self.call.irecv(buf, self.ranks[src])

    def wait(self, requests) -> None:
        self.call.wait(requests)


def members(comm) -> list[list[int]]:
    """The group's ranks by node, nodes in the order of their first group rank (cached)."""
    world_map = nodes.nodes()
    cached = getattr(comm, "_members_by_node", None)
    if cached is not None and cached[0] is world_map:
        return cached[1]
    found = world_map.by_node(comm.global_ranks)
    comm._members_by_node = (world_map, found)
    return found


def shape(comm) -> tuple[int, int] | None:
    """(nodes, ranks per node) when the group spans nodes of equal size, else None: what `auto`
    prices two-level schemes by (and the trace shows). Reads the node map init() found."""
    if process.nodes is None or comm.size == 1:
        return None
    by_node = members(comm)  # cached on the group
    if len(by_node) > 1 and len({len(m) for m in by_node}) == 1:
        return len(by_node), len(by_node[0])
    return None


def levels(call, by_node):
    """(inside, across) for this rank, or None when the nodes hold unequal numbers of ranks."""
    if len({len(m) for m in by_node}) != 1:
        return None
    node = next(m for m in by_node if call.rank in m)
    j = node.index(call.rank)
    return Level(call, node, "inside"), Level(call, [m[j] for m in by_node], "across")


def all_reduce_hierarchical(call, x, op) -> None:
    """Reduce-scatter inside the node, all-reduce each chunk across nodes, all-gather inside."""
    # BEGIN ANSWER ex04_hierarchical_allreduce all_reduce_two_level
    by_node = members(call.comm)
    two = levels(call, by_node) if len(by_node) > 1 else None
    if two is None:  # one node, or unequal nodes: the flat ring
        return ring.all_reduce_ring(call, x, op)
    inside, across = two
    edges = layout.bounds(len(x), inside.size)
    ring.reduce_scatter_inplace(inside, x, edges, op)
    ring.all_reduce_ring(across, layout.chunk(x, edges, inside.rank), op)
    ring.all_gather_inplace(inside, x, edges)
    # END ANSWER


def _by_position(by_node, n: int) -> list[int]:
    """Where each group rank's block sits when blocks are ordered (position, node): the blocks
    of one position on every node are then contiguous, one chunk for the inside ring."""
    N = len(by_node)
    where = [0] * (N * len(by_node[0]))
    for b, node in enumerate(by_node):
        for i, g in enumerate(node):
            where[g] = (i * N + b) * n
    return where


def reduce_scatter_hierarchical(call, out, inp, op) -> None:
    """Reorder the blocks by (position, node); reduce-scatter those chunks inside the node;
    then local rank j reduce-scatters its chunk (position j of every node) across nodes."""
    by_node = members(call.comm)
    two = levels(call, by_node) if len(by_node) > 1 else None
    if two is None:
        return ring.reduce_scatter_ring(call, out, inp, op)
    inside, across = two
    n, N = len(out), len(by_node)
    work = workspace.empty(inp, len(inp), 2)  # slots 0 and 1 are the rings' scratch
    for g, at in enumerate(_by_position(by_node, n)):
        buffers.copy_(work[at : at + n], inp[g * n : (g + 1) * n])
    edges = [i * N * n for i in range(inside.size + 1)]
    ring.reduce_scatter_inplace(inside, work, edges, op)
    ring.reduce_scatter_ring(across, out, layout.chunk(work, edges, inside.rank), op)


def all_gather_hierarchical(call, out, inp) -> None:
    """All-gather across nodes first (my block to my position on every node), then the chunks
    of every position inside the node, then back into rank order."""
    by_node = members(call.comm)
    two = levels(call, by_node) if len(by_node) > 1 else None
    if two is None:
        return ring.all_gather_ring(call, out, inp)
    inside, across = two
    n, N = len(inp), len(by_node)
    work = workspace.empty(inp, len(out), 2)
    edges = [i * N * n for i in range(inside.size + 1)]
    ring.all_gather_ring(across, layout.chunk(work, edges, inside.rank), inp)
    ring.all_gather_inplace(inside, work, edges)
    for g, at in enumerate(_by_position(by_node, n)):
        buffers.copy_(out[g * n : (g + 1) * n], work[at : at + n])


def broadcast_hierarchical(call, x, root: int) -> None:
    """A pipelined chain among one leader a node (the root on its node; elsewhere the rank at
    the root's position, or the node's first on a smaller node), then a chain inside each node."""
    by_node = members(call.comm)
    if len(by_node) == 1:
        return ring.broadcast_ring(call, x, root)
    home = next(m for m in by_node if root in m)
    j = home.index(root)
    leaders = [m[j] if j < len(m) else m[0] for m in by_node]
    if call.rank in leaders:
        ring.broadcast_ring(Level(call, leaders, "across"), x, by_node.index(home))
    node = next(m for m in by_node if call.rank in m)
    inside = Level(call, node, "inside", _chain_steps(x, len(by_node)))  # steps after across's
    ring.broadcast_ring(inside, x, node.index(leaders[by_node.index(node)]))


def _chain_steps(x, p: int) -> int:
    """Steps of ring.broadcast_ring over p ranks: segments + p - 2."""
    seg = max(1, ring.SEGMENT_BYTES // buffers.itemsize(x))
    return max(1, -(-len(x) // seg)) + p - 2
