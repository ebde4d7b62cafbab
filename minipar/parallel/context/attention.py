"""ContextParallelSelfAttention: the tensor-parallel attention layer with its sequence split over
a context-parallel group too: each rank holds local_seq = seq/cp tokens of its tp rank's heads.

    attn = ContextParallelSelfAttention.from_dense(dense, tp_group, cp_group, variant="ring")
    y = attn(x)            # x: (batch, local_seq, hidden), this rank's tokens in the
                           # load-balanced causal layout (shard_sequence(..., causal=True))

Everything but attention is per token, so the projections run on the local tokens as they
would on the full sequence (qkv column-parallel over tp, proj row-parallel: its g all-reduces
over tp, b x local_seq x hidden values, 1/cp of the dense layer's). Only the attention itself
needs every key: ring_attention (K/V blocks around the cp ring, (cp-1) blocks forward, twice
that backward) or ulysses_attention (4 all-to-alls each way; the local heads, n_heads/tp, must
divide by cp), both causal on the load-balanced layout, so the tokens' positions must be those
of `layout.positions(cp_rank, cp, seq, causal=True)` (the GPT's embedding adds them).
"""

from __future__ import annotations

from minipar.parallel.context.ring import ring_attention
from minipar.parallel.context.ulysses import ulysses_attention
from minipar.parallel.tensor.attention import ParallelSelfAttention

VARIANTS = {"ring": ring_attention, "ulysses": ulysses_attention}


class ContextParallelSelfAttention(ParallelSelfAttention):
    """ParallelSelfAttention (heads over `group`) whose attention runs over `cp_group`."""

    def __init__(self, *args, cp_group=None, variant: str = "ring", **kwargs):
        super().__init__(*args, **kwargs)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        self.cp_group, self.variant = cp_group, variant

    @classmethod
    def from_dense(cls, dense, group=None, cp_group=None, variant: str = "ring"):
        """This tp rank's heads of a DenseSelfAttention (ParallelSelfAttention.from_dense), their
        attention over cp_group."""
        layer = super().from_dense(dense, group)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        layer.cp_group, layer.variant = cp_group, variant
        return layer

    def attend(self, q, k, v):
        return VARIANTS[self.variant](q, k, v, group=self.cp_group, causal=True)

    def extra_repr(self) -> str:
        return f"variant={self.variant}"
