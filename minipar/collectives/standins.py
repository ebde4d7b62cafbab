"""Stand-ins: what the student edition runs where an answer it cut is reused by other code.

In a course's hand-out (minipar/course/handout.py) the ring's phases are exercise 03's answer,
yet the two-level all-reduce, the ring reduce-scatter and all-gather, FSDP and ZeRO reuse them.
There they run these instead: the same result, chunk for chunk, by other messages (every rank
talks to every other at once, as the linear algorithms do), so nothing of the answer is shown.
The full edition never calls them.
"""

from __future__ import annotations

from minipar.collectives import layout
from minipar.collectives.reduce_op import reduce_
from minipar.comm.transport import buffers


def reduce_scatter_inplace(call, x, edges, op) -> None:
    """Chunk r of x becomes the reduction of every rank's chunk r: each rank sends chunk q
    straight to rank q and reduces the p-1 chunks it receives into its own. (p-1)/p n bytes a
    rank, as the ring's phase, in 1 step of p-1 messages instead of p-1 steps."""
    p, r = call.size, call.rank
    others = [q for q in range(p) if q != r]
    mine = layout.chunk(x, edges, r)
    incoming = [buffers.empty(x, len(mine)) for _ in others]
    for _ in call.rounds(1):
        requests = [call.irecv(buf, q) for buf, q in zip(incoming, others)]
        requests += [call.isend(layout.chunk(x, edges, q), q) for q in others]
        call.wait(requests)
    for buf in incoming:
        reduce_(mine, buf, op)


def all_gather_inplace(call, x, edges) -> None:
    """Rank r owns chunk r of x; it sends it to every other rank and receives theirs in place:
    (p-1)/p n bytes a rank in 1 step of p-1 messages."""
    p, r = call.size, call.rank
    others = [q for q in range(p) if q != r]
    for _ in call.rounds(1):
        requests = [call.irecv(layout.chunk(x, edges, q), q) for q in others]
        requests += [call.isend(layout.chunk(x, edges, r), q) for q in others]
        call.wait(requests)
