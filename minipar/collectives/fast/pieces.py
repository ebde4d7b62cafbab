"""Fast path: the ring all-reduce, each reduce-scatter step received in pieces that stay in cache.

ring.py's reduce-scatter step receives a whole chunk (n/p bytes) into scratch and then adds it
into x. At 64 MiB on 2 ranks that scratch is 32 MiB: MPI writes it out to memory, and the add
reads it back in (a third of the add's memory traffic, and the receiver's copy-out of MPI's
shared cells lands in memory, not in cache). Here the same step goes in pieces of PIECE_BYTES:
each piece arrives in a small scratch buffer that fits the core's cache and is reduced into x
at once, while it is still there.

    step s (reduce-scatter), piece k:  send piece k of chunk (r-s-1) right, receive piece k of
                                       chunk (r-s-2) from the left into scratch, x_c[k] op= scratch
    then the ring's all-gather (ring.all_gather_inplace), unchanged

Per rank: 2 (p-1)/p n bytes, as the ring; (p-1) ceil(n/p / PIECE_BYTES) + (p-1) messages in as
many steps (every rank cuts every chunk at the same offsets, as many pieces as chunk 0 has: a
shorter chunk's last piece may be empty). Every element is reduced as ring.py reduces it
(x_c = x_c op received, chunk c on the same rank at the same step), so the bits are the ring's.
Taken (fast/routing.py) for a blocking ring all-reduce of a numpy buffer over MPI with no trace
open (a trace records the ring's own messages) when a chunk spans more than one piece; never in
the student edition, whose ring is the student's. Measured (docs/bench.md, "Where the time goes
at 1 MiB and 64 MiB"): 20% off the ring at 16 MiB on 2 ranks, 0-18% at 64 MiB.
"""

from __future__ import annotations

import os

from minipar.collectives import layout, ring, workspace
from minipar.collectives.reduce_op import reduce_

PIECE_BYTES = int(os.environ.get("MINIPAR_RING_PIECE", 1 << 20))  # fits a core's L2 (2 MiB here)


def ring_is_minipars() -> bool:
    """Whether ring.py's ring is minipar's own, whose bits this file keeps; in the student
    edition it is the student's, which every ring call runs."""
    # BEGIN ANSWER ex03_ring_allreduce do: return False
    return True
    # END ANSWER


def worth_it(nbytes: int, p: int) -> bool:
    """Whether a ring chunk of an nbytes all-reduce on p > 1 ranks spans more than one piece."""
    return p > 1 and nbytes > p * PIECE_BYTES


def all_reduce_ring_pieces(call, x, op) -> None:
    """The ring all-reduce of ring.py, its reduce-scatter steps received piece by piece."""
    # BEGIN ANSWER ex03_ring_allreduce all_reduce_ring
    p, r = call.size, call.rank
    right, left = (r + 1) % p, (r - 1) % p
    edges = layout.bounds(len(x), p)
    step = max(1, PIECE_BYTES // x.itemsize)
    scratch = workspace.empty(x, min(step, edges[1]))
    for s in call.rounds(p - 1):
        outgoing = layout.chunk(x, edges, (r - s - 1) % p)
        incoming = layout.chunk(x, edges, (r - s - 2) % p)
        for a in range(0, edges[1], step):  # chunk 0 is the longest: every rank cuts as many
            piece = incoming[a : a + step]
            tmp = scratch[: len(piece)]
            call.sendrecv(outgoing[a : a + step], right, tmp, left)
            reduce_(piece, tmp, op)
    ring.all_gather_inplace(call, x, edges)
    # END ANSWER
