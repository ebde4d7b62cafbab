"""Double binary tree all-reduce, as NCCL does across nodes (Sanders, Speck and Traeff, 2009).

One binary tree reduces up and broadcasts down in 2 log2 p steps, but its leaves (half the ranks)
only ever send and receive, while interior ranks carry three messages: the links are used
unevenly. Two trees fix that: tree A has the even ranks as leaves, tree B the odd ones, and each
tree carries half of the buffer, so every rank is a leaf in one tree and interior in the other.

Tree shape: ranks sit at in-order positions v = 1..p of a binary tree in which position v's
height is the number of trailing zero bits of v (odd positions are leaves), as in NCCL's
`ncclGetBtree`. A: rank r at v = r + 1. B: rank r at v = r, rank 0 at v = p.

    p = 4    tree A: 3 -> 1 -> {0, 2}      tree B: 0 -> 2 -> {1, 3}

This version is not pipelined (NCCL streams segments through the trees), so each tree takes
about 2 height * (alpha + n/2 beta); the ledger and minipar.cost describe what is coded here.
"""

from __future__ import annotations

import functools

from minipar.collectives import layout
from minipar.collectives.reduce_op import reduce_
from minipar.comm.transport import buffers


def tree_links(p: int, position_of) -> tuple[dict, dict]:
    """(parent, children) by rank for ranks placed at 1-based in-order positions."""
    rank_at = {position_of(r): r for r in range(p)}
    parent, children = {}, {r: [] for r in range(p)}
    for r in range(p):
        v = position_of(r)
        while True:  # climb until an ancestor position exists (p need not be 2^k - 1)
            low = v & -v
            v = (v | (low << 1)) & ~low
            if v in rank_at or v > 2 * p:
                break
        parent[r] = rank_at.get(v)
        if parent[r] is not None:
            children[parent[r]].append(r)
    return parent, children


def trees(p: int):
    """The two trees: [(parent, children) of A, (parent, children) of B]."""
    return [tree_links(p, lambda r: r + 1), tree_links(p, lambda r: r if r else p)]


def _heights(parent, children, p: int) -> tuple[dict, dict]:
    """Height (longest path down to a leaf) and depth (distance from the root) of each rank."""
    height, depth = {}, {}

    def h(r):
        if r not in height:
            height[r] = 1 + max((h(c) for c in children[r]), default=-1)
        return height[r]

    def d(r):
        if r not in depth:
            depth[r] = 0 if parent[r] is None else 1 + d(parent[r])
        return depth[r]

    for r in range(p):
        h(r), d(r)
    return height, depth


@functools.lru_cache(maxsize=8)
def _shapes(p: int):
    """(the two trees, their heights and depths, the greater height), worked out once per p:
    every rank would otherwise walk all p positions on every call (at p = 4,096 in the
    simulator, 4,096 walks of 4,096 per call)."""
    shapes = trees(p)
    levels = [_heights(parent, children, p) for parent, children in shapes]
    top = max(max(height.values()) for height, _ in levels)
    return shapes, levels, top


def all_reduce_double_tree(call, x, op) -> None:
    """Reduce each half up its tree, then broadcast it down.

    Steps: up to 2 H, H the trees' height (about log2 p). Per rank: a leaf sends and receives
    n/2 once; an interior rank receives n/2 from each child, sends n/2 up, and n/2 to each child.
    The root of each tree reduces its half once and copies it, so all ranks are identical.
    """
    p, r = call.size, call.rank
    edges = layout.bounds(len(x), 2)
    shapes, levels, top = _shapes(p)
    halves = [layout.chunk(x, edges, t) for t in range(2)]
    # up: wait for the children's partial results, add them, pass the sum to the parent
    for t, ((parent, children), (height, _)) in enumerate(zip(shapes, levels)):
        half = halves[t]
        incoming = [buffers.empty(x, len(half)) for _ in children[r]]
        requests = []
        for buf, child in zip(incoming, children[r]):
            call.step = height[child]
            requests.append(call.irecv(buf, child))
        call.wait(requests)
        for buf in incoming:
            reduce_(half, buf, op)
        if parent[r] is not None:
            call.step = height[r]
            call.send(half, parent[r])
    # down: the root's half is final; each rank takes its parent's and forwards it
    for t, ((parent, children), (_, depth)) in enumerate(zip(shapes, levels)):
        half = halves[t]
        if parent[r] is not None:
            call.step = top + depth[parent[r]]
            call.recv(half, parent[r])
        call.step = top + depth[r]
        call.wait([call.isend(half, child) for child in children[r]])
