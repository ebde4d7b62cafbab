"""Pairwise all-to-all: in step k rank r sends its block for r + k and receives from r - k.

    p = 4   step 0: 0->1 1->2 2->3 3->0    step 1: 0->2 1->3 2->0 3->1    step 2: 0->3 ...

p - 1 steps; each sends and receives (p-1) n bytes (n = one block). Unlike the linear version,
which posts everything at once, each step waits for the last, so a rank has at most one message
in and one out at a time: gentler on the network and on memory for large p (MPICH and Open MPI
use it for large messages).
"""

from __future__ import annotations

from minipar.collectives import layout
from minipar.comm.transport import buffers


def all_to_all_pairwise(call, out, inp, out_edges=None, in_edges=None) -> None:
    """Blocks of unequal size (out_edges / in_edges: p + 1 offsets each) move the same way."""
    p, r = call.size, call.rank
    oe, ie = out_edges or layout.bounds(len(out), p), in_edges or layout.bounds(len(inp), p)
    buffers.copy_(layout.chunk(out, oe, r), layout.chunk(inp, ie, r))
    for k in call.rounds(p - 1):
        dst, src = (r + k + 1) % p, (r - k - 1) % p
        call.sendrecv(layout.chunk(inp, ie, dst), dst, layout.chunk(out, oe, src), src)
