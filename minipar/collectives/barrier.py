"""The dissemination barrier (Hensgen, Finkel and Manber, 1988).

In step k rank r signals rank r + 2^k and waits for a signal from r - 2^k. After ceil(log2 p)
steps every rank has heard, directly or through others, from every other rank, so no rank leaves
before all have arrived. It works for any p, needs no root, and each message is empty.
"""

from __future__ import annotations

import numpy as np


def barrier_dissemination(call) -> None:
    """ceil(log2 p) steps, one empty message out and in per step."""
    p, r = call.size, call.rank
    token_out, token_in = np.empty(0, np.uint8), np.empty(0, np.uint8)
    for k in call.rounds((p - 1).bit_length()):
        dist = 1 << k
        call.sendrecv(token_out, (r + dist) % p, token_in, (r - dist) % p)
