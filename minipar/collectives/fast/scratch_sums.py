"""Fast path: the ring all-reduce with its partial sums in scratch, for chunks that fit in cache.

ring.py's reduce-scatter adds each received chunk into x. But most of x was read by the
neighbours a moment ago: the previous call's all-gather sent its chunks straight out of x (MPICH
moves a large message as one copy by the kernel, made on the reader's core), so their lines sit
in another core's cache, and a core must take each line back before it may write it. While a
chunk fits in cache that, not the add, is the step's time: a float32 sum of 128 KiB took 3 us on
private lines and 32-33 us into lines the neighbour had read (docs/records/2026-12-08-
coherence.txt). Here each step's sum goes into the scratch buffer the chunk was received in,
whose lines this core has just written, and the result is sent on from there:

    step s (reduce-scatter): receive chunk c = r-s-2 from the left into scratch[s % 2],
                             scratch = x_c op scratch, send it right at step s+1
    then: x_r = scratch (my reduced chunk, one copy), and ring.all_gather_inplace, unchanged

Per rank: 2 (p-1)/p n bytes in 2 (p-1) steps, the ring's messages; one more copy of n/p bytes;
two scratch chunks. Every element is reduced as ring.py reduces it (x_c op received, chunk c on
the same rank at the same step), so the bits are the ring's. Taken (fast/routing.py) where
pieces.py is, for a ring of 64 KiB or more whose chunks are CACHED_BYTES or less; never in the
student edition.
Measured on 2 ranks against ring.py's own (ring@mpi), medians (docs/records/2026-12-08-
coherence.txt, scripts/core_placement.py --rings): 256 KiB 75-76 against 91-98 us, 1 MiB
207-227 against 258 us; at 2 MiB (chunks of 1 MiB, not taken) the two are alike, 363-400 us.
"""

from __future__ import annotations

from minipar.collectives import layout, ring, workspace
from minipar.collectives.reduce_op import reduce_into
from minipar.comm.transport import buffers

CACHED_BYTES = 512 << 10  # a ring chunk this size or less stays in a core's cache (2 MiB L2)


def worth_it(nbytes: int, p: int) -> bool:
    """Whether an nbytes all-reduce on p > 1 ranks has ring chunks that stay in cache (routing
    asks from cost.SHM_MIN_BYTES, 64 KiB, up: below, a message's latency rules)."""
    return p > 1 and nbytes / p <= CACHED_BYTES


def all_reduce_ring_scratch(call, x, op) -> None:
    """The ring all-reduce of ring.py, its partial sums kept in two scratch chunks that take
    turns (one is sent while the next arrives)."""
    # BEGIN ANSWER ex03_ring_allreduce all_reduce_ring
    p, r = call.size, call.rank
    right, left = (r + 1) % p, (r - 1) % p
    edges = layout.bounds(len(x), p)
    longest = max(edges[c + 1] - edges[c] for c in range(p))
    scratch = [workspace.empty(x, longest, 0), workspace.empty(x, longest, 1)]
    outgoing = layout.chunk(x, edges, (r - 1) % p)
    for s in call.rounds(p - 1):
        mine = layout.chunk(x, edges, (r - s - 2) % p)
        got = scratch[s % 2][: len(mine)]
        call.sendrecv(outgoing, right, got, left)
        reduce_into(got, mine, got, op)  # x_c op received: ring.py's operands, in its order
        outgoing = got
    buffers.copy_(layout.chunk(x, edges, r), outgoing)
    ring.all_gather_inplace(call, x, edges)
    # END ANSWER
