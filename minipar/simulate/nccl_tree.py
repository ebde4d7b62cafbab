"""NCCL's tree across nodes: a chain inside each node, a double binary tree between the nodes.

NCCL's tree all-reduce (Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4",
NVIDIA blog, 2019; src/graph/trees.cc) never runs a tree over GPUs: inside a node the GPUs form
a chain, and only the chain's head talks to other nodes, along a binary tree over the nodes.
Two trees at once, each carrying half of the buffer; a node that is a leaf of one is interior
in the other (collectives/double_tree.py builds both over the nodes here). Its latency is what
NCCL's tuner charges (tuning.cc, `2 * ((nRanks/nNodes - 1) * intraLat + log2i(nNodes) *
interLat)`): up the chain, up log2(nodes) network hops, and back down.

    node k, tree 0:  local 0 (head) <- 1 <- 2 <- ... <- 7      the head: to/from node k's
    node k, tree 1:  local 7 (head) <- 6 <- 5 <- ... <- 0      parent and children in tree t

The two heads are different GPUs (so different NICs), as NCCL's channels spread the trees over
a node's NICs. Each half streams through in `chunks` pieces at once (runner.concurrently), so
chunk c rides one hop behind chunk c-1: a pipelined tree, as NCCL's. With LL and LL128 (issue
73) the pieces are NCCL's own chunks, one a loop of its channels (proxy.py, enqueue.cc
calcCollChunking), and the hops differ as NCCL's do: inside a node a part cuts through, line
by line (network.py `stream`: prims_ll128.h forwards each line as its flag lands), across nodes
it leaves once whole (net.cc sendProxyProgress posts a full slot) and lands at the wire's pace.
"""

from __future__ import annotations

from minipar.collectives import layout
from minipar.collectives.double_tree import trees
from minipar.simulate.runner import concurrently
from minipar.state import process


def tree_links(rank: int, per_node: int, nodes: int, tree: int) -> tuple:
    """(parent, children) of world `rank` in NCCL's tree `tree` (0 or 1): world ranks."""
    node, local = divmod(rank, per_node)
    order = list(range(per_node)) if tree == 0 else list(reversed(range(per_node)))
    at = order.index(local)
    children = [node * per_node + order[at + 1]] if at + 1 < per_node else []
    if at > 0:
        return node * per_node + order[at - 1], children
    parent, kids = trees(nodes)[tree] if nodes > 1 else ({0: None}, {0: []})
    head = order[0]
    up = parent[node]
    children += [child * per_node + head for child in kids[node]]
    return (None if up is None else up * per_node + head), children


def all_reduce_nccl_tree(x, per_node: int, chunks: int = 1) -> None:
    """All-reduce x in place over the simulated world (a whole number of nodes of per_node)."""
    comm = process.world
    p, rank = comm.size, comm.rank
    if p % per_node:
        raise ValueError(f"NCCL's tree needs whole nodes: {p} ranks, {per_node} a node")
    nodes = p // per_node
    halves = layout.bounds(len(x), 2)
    thunks = []

    def away(peer: int) -> bool:
        return peer // per_node != rank // per_node

    for tree in range(2):
        parent, children = tree_links(rank, per_node, nodes, tree)
        half = layout.chunk(x, halves, tree)
        edges = layout.bounds(len(half), chunks)
        for c in range(chunks):
            part = layout.chunk(half, edges, c)
            tag = 2 * c + tree
            thunks.append(
                lambda part=part, tag=tag, up=parent, down=children: _reduce_broadcast(
                    comm, part, up, down, tag, away
                )
            )
    concurrently(thunks)


def _reduce_broadcast(comm, part, parent, children, tag, away) -> None:
    """Up: add every child's part, pass the sum to the parent; down: take the parent's
    result, pass it to every child. Inside a node a part may stream (network.py `stream`: a
    rank forwards from the first line it got); a part for another node leaves only once what
    it carries has landed whole (`away`: NCCL's proxy posts full slots), and the rank is done
    when its result has."""
    task = comm.task
    ready = task.clock  # when every byte this rank's part depends on has landed
    incoming = [part.copy() for _ in children]
    for buf, child in zip(incoming, children):
        request = comm.irecv(buf, child, tag)
        request.wait()
        ready = max(ready, request.whole)
        part += buf
    if parent is not None:
        if away(parent):
            task.clock = max(task.clock, ready)
        comm.send(part, parent, tag)
        request = comm.irecv(part, parent, tag)
        request.wait()
        ready = max(ready, request.whole)
    for child in children:
        if away(child):
            task.clock = max(task.clock, ready)
        comm.send(part, child, tag)
    task.clock = max(task.clock, ready)
