"""All-reduce, all-gather and reduce-scatter over shared windows (transport/shm.py), one copy a hop.

In shared memory every peer is one hop away, so the ring's p-1 relays buy nothing: each rank
publishes its data once in its own segment and then reads what it needs straight out of its
peers' segments. For a buffer of n bytes on p ranks, per rank:

- all-reduce: copy n in; reduce my chunk (n/p) with the p-1 peers' copies of it, in my
  segment; copy the p-1 other final chunks out. 3 waits (READY, REDUCED, DONE), n bytes
  published, (p-1)/p n read from peers and reduced, (p-1)/p n copied out.
  Chunk c is reduced by rank c alone, then copied: every rank ends bitwise identical.
- all-gather (n = the whole output): copy my block (n/p) in; copy the p-1 others out. 2 waits.
- reduce-scatter (n = the whole input): copy n in; reduce my block from the p segments. 2 waits.

Messages larger than a segment (shm.MAX_SEGMENT) go in pieces, a round each. A buffer that
lives in a window already (comm/transport/shm_buffers.py) skips the copy in: in_place.py.

The trace records what the peers read as the messages it replaces (`log`): rank q reading my
data is a message from me to q, with path "shm" (through my segment). The bytes are the ring's,
2 (p-1)/p n per rank for all-reduce, (p-1)/p n for the other two, in 2 steps (1 for those two).

The same bits as the ring over MPI: each element is reduced in the order the ring reduces it
(ring.py), so turning the fast paths off changes no result. In the ring, element e of chunk c
(chunks: layout.bounds over the whole buffer) starts at rank c+1 and gathers one rank's value
a hop: all-reduce computes x_c op (x_c-1 op (... op (x_c+2 op x_c+1))), reduce-scatter
((x_c+1 op x_c+2) op ...) op x_c (ranks mod p); `ring_fold` does the same here.
"""

from __future__ import annotations

import zlib

from minipar.collectives import layout
from minipar.collectives.reduce_op import reduce_into
from minipar.comm.trace import ledger
from minipar.comm.transport import buffers, shm
from minipar.comm.transport.shm import DONE, READY, REDUCED
from minipar.state import process


def view(seg, like, count: int, start: int = 0):
    """count elements of like's dtype at element `start` of a segment, as like's kind."""
    size = buffers.itemsize(like)
    raw = seg[start * size : (start + count) * size]
    if buffers.is_torch(like):
        return buffers.torch_module().from_numpy(raw).view(like.dtype)
    return raw.view(like.dtype)


def call_code(collective: str, like) -> int:
    """A number that ranks in the same call agree on (checked with the size, per round)."""
    return zlib.crc32(f"{collective}:{buffers.dtype_name(like)}".encode())


def log(call, path: str, step: int, peer_bytes) -> list:
    """Record in the open traces, for each peer q, a message of peer_bytes[q][0] bytes from q
    (what I read of q's data) and one of peer_bytes[q][1] to q (what q reads of mine); the
    receives, for `read` to note when they are done (none when no trace is open)."""
    if not process.traces:
        return []
    received = []
    for q, (got, gave) in enumerate(peer_bytes):
        if q != call.rank:
            args = (call.comm, call.collective, call.algorithm, call.seq, step)
            received.append(ledger.record(*args, "recv", q, got, path=path))
            ledger.record(*args, "send", q, gave, path=path)
    return received


def read(received) -> None:
    """The peers' data is read: the receives `log` recorded are done now (so a trace's arrow
    ends after the peer published, not when the call began)."""
    for message in received:
        ledger.done(message.clock)


def chunk_bytes(blocks, p: int, size: int) -> list[int]:
    """Bytes of chunk q summed over the blocks (each block cut in p chunks), for every q."""
    total = [0] * p
    for a, b in blocks:
        edges = layout.bounds(b - a, p)
        for q in range(p):
            total[q] += (edges[q + 1] - edges[q]) * size
    return total


def log_all_reduce(call, path: str, step: int, blocks, p: int, size: int) -> list:
    """An all-reduce round in the trace: step: what I reduce (my chunk of each peer's data) and
    what they reduce of mine; step + 1: their final chunks to me, mine to them."""
    if not process.traces:
        return []
    chunks, r = chunk_bytes(blocks, p, size), call.rank
    return log(call, path, step, [(chunks[r], chunks[q]) for q in range(p)]) + log(
        call, path, step + 1, [(chunks[q], chunks[r]) for q in range(p)]
    )


def pieces(total: int, per_piece: int):
    a = 0
    while True:
        b = min(total, a + max(1, per_piece))
        yield a, b
        if b >= total:
            return
        a = b


def all_reduce(node, call, x, op) -> None:
    """x (1-D) reduced over the node's ranks, in place; see the module docstring.

    Pipelined in blocks: in turn j a rank publishes block j, reduces its chunk of block j-L
    (published by the peers L turns ago) and gathers the peers' final chunks of block j-2L
    (L = shm.LAG: ranks may drift apart by that many blocks without waiting)."""
    p, size = node.size, buffers.itemsize(x)
    code = call_code("all_reduce", x)
    ring_edges = layout.bounds(len(x), p)
    for i, (a, b) in enumerate(pieces(len(x), _capacity(node) // size)):
        piece = x[a:b]
        seg = node.begin((b - a) * size, code, call.context)
        blocks = list(pieces(b - a, max(p, shm.BLOCK_BYTES // size)))
        received = log_all_reduce(call, "shm", 2 * i, blocks, p, size)
        base = node.blocks
        lag = shm.LAG
        for j in range(len(blocks) + 2 * lag):
            if j < len(blocks):
                _publish_block(node, seg, piece, blocks[j], base + j + 1)
            if 0 <= j - lag < len(blocks):
                block, turn = blocks[j - lag], base + j - lag + 1
                _reduce_block(node, call, seg, piece, block, turn, op, ring_edges, a)
            if 0 <= j - 2 * lag < len(blocks):
                _gather_block(node, call, piece, blocks[j - 2 * lag], base + j - 2 * lag + 1)
        node.blocks = base + len(blocks)
        read(received)
        node.publish(DONE)


def _publish_block(node, seg, piece, block, count) -> None:
    """Copy the chunks of one block that the peers reduce into my segment; mine stays put."""
    a, b = block
    edges = layout.bounds(b - a, node.size)
    for q in node.peers():
        lo, hi = a + edges[q], a + edges[q + 1]
        buffers.copy_(view(seg, piece, hi - lo, lo), piece[lo:hi])
    node.publish(READY, count)


def ring_fold(out, value, c: int, p: int, op, partial_first: bool) -> None:
    """out = the reduction of value(q) over the p ranks q in the ring's order for chunk c:
    from rank c+1 on, one rank a hop; each hop computes `mine op partial` (all-reduce) or, with
    partial_first, `partial op mine` (reduce-scatter). value(q): rank q's elements, same shape."""
    order = [(c + k) % p for k in range(1, p + 1)]
    first, second = (value(order[0]), value(order[1])) if partial_first else (value(order[1]),
                     value(order[0]))  # fmt: skip
    reduce_into(out, first, second, op)
    for q in order[2:]:
        a, b = (out, value(q)) if partial_first else (value(q), out)
        reduce_into(out, a, b, op)


def ring_spans(lo: int, hi: int, edges):
    """(start, stop, chunk) for the pieces of elements [lo, hi) in each ring chunk of `edges`."""
    c = max(i for i in range(len(edges) - 1) if edges[i] <= lo) if hi > lo else 0
    while lo < hi:
        stop = min(hi, edges[c + 1])
        if stop > lo:
            yield lo, stop, c
        lo, c = stop, c + 1


def _reduce_block(node, call, seg, piece, block, count, op, ring_edges, at) -> None:
    """My chunk of one block, reduced into my segment in the ring's order (`ring_edges`: the
    ring's chunks of the whole buffer; `at`: where this piece starts in it)."""
    a, b = block
    edges = layout.bounds(b - a, node.size)
    lo, hi = a + edges[node.rank], a + edges[node.rank + 1]
    node.wait_all(READY, call.context, count)
    mine = view(seg, piece, hi - lo, lo)
    for start, stop, c in ring_spans(at + lo, at + hi, ring_edges):
        i, j = start - at, stop - at

        def value(q, i=i, j=j):
            return piece[i:j] if q == node.rank else view(node.segments[q], piece, j - i, i)

        ring_fold(mine[i - lo : j - lo], value, c, node.size, op, partial_first=False)
    node.publish(REDUCED, count)
    buffers.copy_(piece[lo:hi], mine)


def _gather_block(node, call, piece, block, count) -> None:
    a, b = block
    edges = layout.bounds(b - a, node.size)
    node.wait_all(REDUCED, call.context, count)
    for q in node.peers():
        lo, hi = a + edges[q], a + edges[q + 1]
        buffers.copy_(piece[lo:hi], view(node.segments[q], piece, hi - lo, lo))


def all_gather(node, call, out, inp) -> None:
    """Block q of out = rank q's inp, read out of rank q's segment; pipelined like all_reduce
    (turn j publishes block j of my input and copies the peers' block j-L out)."""
    n, size, r = len(inp), buffers.itemsize(inp), node.rank
    code = call_code("all_gather", inp)
    for i, (a, b) in enumerate(pieces(n, _capacity(node) // size)):
        seg = node.begin((b - a) * size, code, call.context)
        received = log(call, "shm", i, [((b - a) * size, (b - a) * size)] * node.size)
        blocks = list(pieces(b - a, shm.BLOCK_BYTES // size))
        base = node.blocks
        for j in range(len(blocks) + shm.LAG):
            if j < len(blocks):
                lo, hi = blocks[j]
                buffers.copy_(view(seg, inp, hi - lo, lo), inp[a + lo : a + hi])
                node.publish(READY, base + j + 1)
                buffers.copy_(out[r * n + a + lo : r * n + a + hi], inp[a + lo : a + hi])
            if 0 <= j - shm.LAG < len(blocks):
                lo, hi = blocks[j - shm.LAG]
                node.wait_all(READY, call.context, base + j - shm.LAG + 1)
                for q in node.peers():
                    peer = view(node.segments[q], inp, hi - lo, lo)
                    buffers.copy_(out[q * n + a + lo : q * n + a + hi], peer)
        node.blocks = base + len(blocks)
        read(received)
        node.publish(DONE)


def reduce_scatter(node, call, out, inp, op) -> None:
    """out = the reduction over ranks of block `rank` of their inp, read from their segments.
    Only the p-1 blocks the peers need are published; mine goes straight into the reduction.
    Pipelined: turn j publishes the peers' pieces [j] and reduces my piece [j-L]."""
    p, r, n, size = node.size, node.rank, len(out), buffers.itemsize(inp)
    code = call_code("reduce_scatter", inp)
    for i, (a, b) in enumerate(pieces(n, _capacity(node) // (size * p))):
        m = b - a  # my segment holds block q's elements [a, b) at q*m
        seg = node.begin(p * m * size, code, call.context)
        received = log(call, "shm", i, [(m * size, m * size)] * p)
        blocks = list(pieces(m, max(1, shm.BLOCK_BYTES // (size * p))))
        base = node.blocks
        for j in range(len(blocks) + shm.LAG):
            if j < len(blocks):
                lo, hi = blocks[j]
                for q in node.peers():
                    src = inp[q * n + a + lo : q * n + a + hi]
                    buffers.copy_(view(seg, inp, hi - lo, q * m + lo), src)
                node.publish(READY, base + j + 1)
            if 0 <= j - shm.LAG < len(blocks):
                lo, hi = blocks[j - shm.LAG]
                node.wait_all(READY, call.context, base + j - shm.LAG + 1)
                _reduce_mine(node, seg, out, inp, op, (a + lo, a + hi), r * m + lo)
        node.blocks = base + len(blocks)
        read(received)
        node.publish(DONE)


def _reduce_mine(node, seg, out, inp, op, span, at) -> None:
    """out[span] = my block's span reduced with each peer's copy of it (at element `at` of the
    segments), in the ring's order for chunk `rank` (ring_fold)."""
    lo, hi = span
    n, r = len(out), node.rank
    first = inp[r * n + lo : r * n + hi]
    if buffers.overlaps(out, inp):  # an in-place call: reduce from a copy of my block
        first = view(seg, inp, hi - lo, at)
        buffers.copy_(first, inp[r * n + lo : r * n + hi])

    def value(q):
        return first if q == r else view(node.segments[q], inp, hi - lo, at)

    ring_fold(out[lo:hi], value, r, node.size, op, partial_first=True)


def _capacity(node) -> int:
    return max(node.capacity, shm.MAX_SEGMENT)


SCHEDULES = {
    "all_reduce": all_reduce,
    "all_gather": all_gather,
    "reduce_scatter": reduce_scatter,
}
