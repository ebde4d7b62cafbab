"""ContextStats: what one rank's context-parallel attention did, counted as it happens.

    stats = ContextStats()
    out = ring_attention(q, k, v, group, causal=True, stats=stats)
    out.sum().backward()
    stats.forward_blocks, stats.forward_scores, stats.wait_seconds

The caller makes the object and passes it in (nothing is kept in module state); every call
given it adds to it. A *block product* is one call of the attention kernel on one query block
and one key block; its *scores* are the query-key dot products it computed, batch x heads x
q_len x k_len (a causal diagonal block counts its masked half too). The load-balanced causal
layout gives every rank the same counts; the contiguous one does not (lesson 09).

Times are host wall-clock seconds: `compute_seconds` inside the block kernels (for Ulysses, the
forward's attention only), `wait_seconds` blocked on messages that had not arrived yet (the
communication compute did not hide; for Ulysses every all-to-all, forward and backward, since
nothing overlaps them). On a GPU the kernels run asynchronously: these times are for the CPU.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass


@dataclass
class ContextStats:
    forward_blocks: int = 0
    backward_blocks: int = 0
    forward_scores: int = 0
    backward_scores: int = 0
    compute_seconds: float = 0.0
    wait_seconds: float = 0.0

    def add_block(self, phase: str, q_shape, k_shape) -> None:
        """Count one block product of queries (..., q_len, d) against keys (..., k_len, d)."""
        scores = math.prod(q_shape[:-1]) * k_shape[-2]
        if phase == "forward":
            self.forward_blocks += 1
            self.forward_scores += scores
        else:
            self.backward_blocks += 1
            self.backward_scores += scores


@contextlib.contextmanager
def timed(stats: ContextStats | None, field: str):
    """Add the seconds spent inside the block to stats.<field> ("compute_seconds" or
    "wait_seconds"); nothing when stats is None."""
    start = time.perf_counter()
    try:
        yield
    finally:
        if stats is not None:
            setattr(stats, field, getattr(stats, field) + time.perf_counter() - start)
