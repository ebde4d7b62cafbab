"""All-reduce, all-gather and reduce-scatter of buffers that live in a shared window already.

A buffer from `minipar.empty(...)` (DDP's buckets, FSDP's flat vectors:
comm/transport/shm_buffers.py) lies in this rank's segment of a window every rank of the node maps,
at the same offset on every rank. So nothing is copied in: each rank reads its peers' buffers where
they are, as NCCL's P2P transport reads a peer GPU's buffer. For n bytes on p ranks, per rank:

- all-reduce: reduce my chunk (n/p) from the p buffers into mine; copy the p-1 other final
  chunks out of their owners' buffers. (p-1)/p n reduced, (p-1)/p n copied: the roofline's
  work (cost/roofline.py), nothing more. 3 waits (READY, REDUCED, DONE).
- all-gather (n = the whole output, in the window): my block into my output (unless the input
  is that block already), the p-1 others copied out of their owners' outputs. 2 waits.
- reduce-scatter (n = the whole input, in the window): my block reduced from the p inputs. 2 waits.

Who may write what, and when: rank c alone reads chunk c of the peers' buffers (to reduce it),
so a rank overwrites a peer's chunk c in its own buffer only after rank c said REDUCED for that
block; the final chunk c is read out of rank c's buffer, so every call ends by waiting for the
peers' DONE: when it returns, the caller may write into its buffer at once.

The same bits as the ring (windows.ring_fold, in the ring's order), so the trace's messages have
the ring's bytes, with path "shm-in-place".
"""

from __future__ import annotations

from minipar.collectives import layout, workspace
from minipar.collectives.fast import windows
from minipar.collectives.fast.windows import ring_fold, ring_spans, view
from minipar.comm.transport import buffers, shm
from minipar.comm.transport.shm import READY, REDUCED
from minipar.comm.transport.shm_buffers import address

PATH = "shm-in-place"


def all_reduce(node, call, x, op, place) -> None:
    """x (1-D, at byte `offset` of `window` on every rank) reduced over the node, in place.

    In turn j a rank reduces its chunk of block j and copies the peers' final chunks of block
    j-L (L = shm.LAG). Every block is published at once: the data is in place already."""
    window, offset = place
    p, size, n = node.size, buffers.itemsize(x), len(x)
    node.begin_in_place(window.serial, offset, n * size, windows.call_code("all_reduce", x),
                        call.context)  # fmt: skip
    theirs = [x if q == node.rank else view(window.segments[q], x, n, offset // size)
              for q in range(p)]  # fmt: skip
    blocks = list(windows.pieces(n, max(p, shm.BLOCK_BYTES // size)))
    received = windows.log_all_reduce(call, PATH, 0, blocks, p, size)
    base, lag, ring_edges = node.blocks, shm.LAG, layout.bounds(n, p)
    node.publish(READY, base + len(blocks))
    for j in range(len(blocks) + lag):
        if j < len(blocks):
            _reduce_block(node, call, theirs, blocks[j], base + j + 1, op, ring_edges)
        if 0 <= j - lag < len(blocks):
            _gather_block(node, call, theirs, blocks[j - lag], base + j - lag + 1)
    node.blocks = base + len(blocks)
    windows.read(received)
    node.end_in_place(call.context)


def _reduce_block(node, call, theirs, block, count, op, ring_edges) -> None:
    """My chunk of one block, reduced from the p buffers into mine in the ring's order. On two
    ranks each element is one op of two operands, safe to write over its own operand; on more,
    my own values are needed last, so the fold goes through a scratch block (in cache)."""
    a, b = block
    edges = layout.bounds(b - a, node.size)
    lo, hi = a + edges[node.rank], a + edges[node.rank + 1]
    node.wait_all(READY, call.context, count)
    x = theirs[node.rank]
    for start, stop, c in ring_spans(lo, hi, ring_edges):

        def value(q, start=start, stop=stop):
            return theirs[q][start:stop]

        if node.size == 2:
            ring_fold(x[start:stop], value, c, 2, op, partial_first=False)
        else:
            scratch = workspace.empty(x, stop - start, slot=1)
            ring_fold(scratch, value, c, node.size, op, partial_first=False)
            buffers.copy_(x[start:stop], scratch)
    node.publish(REDUCED, count)


def _gather_block(node, call, theirs, block, count) -> None:
    a, b = block
    edges = layout.bounds(b - a, node.size)
    node.wait_all(REDUCED, call.context, count)
    x = theirs[node.rank]
    for q in node.peers():
        lo, hi = a + edges[q], a + edges[q + 1]
        buffers.copy_(x[lo:hi], theirs[q][lo:hi])


def all_gather(node, call, out, inp, place) -> None:
    """Block q of out = block q of rank q's out (every out at `place`); turn j puts block j of
    my input in place and copies the peers' block j-L."""
    window, offset = place
    p, r, n, size = node.size, node.rank, len(inp), buffers.itemsize(inp)
    node.begin_in_place(window.serial, offset, p * n * size,
                        windows.call_code("all_gather", inp), call.context)  # fmt: skip
    theirs = [view(window.segments[q], out, p * n, offset // size) for q in range(p)]
    copy_in = address(out) + r * n * size != address(inp)
    blocks = list(windows.pieces(n, shm.BLOCK_BYTES // size))
    received = windows.log(call, PATH, 0, [(n * size, n * size)] * p)
    base = node.blocks
    for j in range(len(blocks) + shm.LAG):
        if j < len(blocks):
            lo, hi = blocks[j]
            if copy_in:
                buffers.copy_(out[r * n + lo : r * n + hi], inp[lo:hi])
            node.publish(READY, base + j + 1)
        if 0 <= j - shm.LAG < len(blocks):
            lo, hi = blocks[j - shm.LAG]
            node.wait_all(READY, call.context, base + j - shm.LAG + 1)
            for q in node.peers():
                buffers.copy_(out[q * n + lo : q * n + hi], theirs[q][q * n + lo : q * n + hi])
    node.blocks = base + len(blocks)
    windows.read(received)
    node.end_in_place(call.context)


def reduce_scatter(node, call, out, inp, op, place) -> None:
    """out = block `rank` of every rank's inp (at `place`), reduced in the ring's order for
    chunk `rank` (windows.ring_fold), block by block."""
    window, offset = place
    p, r, n, size = node.size, node.rank, len(out), buffers.itemsize(inp)
    node.begin_in_place(window.serial, offset, p * n * size,
                        windows.call_code("reduce_scatter", inp), call.context)  # fmt: skip
    theirs = [view(window.segments[q], inp, p * n, offset // size) for q in range(p)]
    theirs[r] = inp
    blocks = list(windows.pieces(n, max(1, shm.BLOCK_BYTES // (size * p))))
    received = windows.log(call, PATH, 0, [(n * size, n * size)] * p)
    aliased = p > 2 and buffers.overlaps(out, inp)  # out is my block: fold through scratch
    node.publish(READY, node.blocks + len(blocks))
    for j, (lo, hi) in enumerate(blocks):
        node.wait_all(READY, call.context, node.blocks + j + 1)
        mine = theirs[r][r * n + lo : r * n + hi]
        if aliased:
            scratch = workspace.empty(inp, hi - lo, slot=1)
            buffers.copy_(scratch, mine)
            mine = scratch

        def value(q, lo=lo, hi=hi, mine=mine):
            return mine if q == r else theirs[q][r * n + lo : r * n + hi]

        ring_fold(out[lo:hi], value, r, p, op, partial_first=True)
    node.blocks += len(blocks)
    windows.read(received)
    node.end_in_place(call.context)


SCHEDULES = {
    "all_reduce": all_reduce,
    "all_gather": all_gather,
    "reduce_scatter": reduce_scatter,
}
