"""Bruck's all-gather: ceil(log2 p) steps for any p, not only powers of two.

Each rank gathers into a scratch buffer that starts with its own block and grows by doubling:
in step k it sends the first min(2^k, p - 2^k) blocks it holds to rank r - 2^k and appends the
same number received from rank r + 2^k. At the end scratch[i] is the block of rank r + i, and one
local rotation puts the blocks in rank order (Bruck et al., IEEE TPDS 1997).

    p = 5, rank 0 holds:  step 0: [0]+[1]   step 1: [0 1]+[2 3]   step 2: [0 1 2 3]+[4]
"""

from __future__ import annotations

from minipar.comm.transport import buffers


def all_gather_bruck(call, out, inp) -> None:
    """ceil(log2 p) steps; (p-1) n bytes sent per rank (n = one block); p n elements of scratch."""
    p, r, n = call.size, call.rank, len(inp)
    held = buffers.empty(inp, p * n)
    buffers.copy_(held[:n], inp)
    have = 1
    for k in call.rounds((p - 1).bit_length()):
        dist = 1 << k
        count = min(dist, p - dist)
        call.sendrecv(
            held[: count * n], (r - dist) % p, held[have * n : (have + count) * n], (r + dist) % p
        )
        have += count
    # held[i] is rank (r + i) % p's block: rotate into rank order
    buffers.copy_(out[r * n :], held[: (p - r) * n])
    buffers.copy_(out[: r * n], held[(p - r) * n :])
