"""Pairwise all-to-all: in step k rank r sends its block for r + k and receives from r - k.

    p = 4   step 0: 0->1 1->2 2->3 3->0    step 1: 0->2 1->3 2->0 3->1    step 2: 0->3 ...

p - 1 steps; each sends and receives (p-1) n bytes (n = one block). Unlike the linear version,
which posts everything at once, each step waits for the last, so a rank has at most one message
in and one out at a time: gentler on the network and on memory for large p (MPICH and Open MPI
use it for large messages).
"""

from __future__ import annotations

from minipar import buffers


def all_to_all_pairwise(call, out, inp) -> None:
    p, r, n = call.size, call.rank, len(inp) // call.size
    buffers.copy_(out[r * n : (r + 1) * n], inp[r * n : (r + 1) * n])
    for k in call.rounds(p - 1):
        dst, src = (r + k + 1) % p, (r - k - 1) % p
        call.sendrecv(inp[dst * n : (dst + 1) * n], dst, out[src * n : (src + 1) * n], src)
