"""Context parallelism: the sequence split across ranks, attention computed without any rank
holding all of it (lesson 09).

    from minipar.parallel.context import ring_attention, ulysses_attention, shard_sequence
    q, k, v = (shard_sequence(t, dim=2, group=cp_group, causal=True) for t in (q, k, v))
    out = ring_attention(q, k, v, group=cp_group, causal=True)   # this rank's shard of the output
    full = unshard_sequence(out, dim=2, group=cp_group, causal=True)

One idea per file: layout.py (which tokens each rank holds: contiguous blocks, or the
load-balanced causal layout, and shard/unshard), online_softmax.py (one block's attention and
log-sum-exp, the exact merge of two blocks, one block's backward), ring.py (ring attention: K/V
around the ring, dK/dV behind them), ulysses.py (all-to-all from a sequence split to a head split
and back), attention.py (the tensor-parallel attention layer with its attention over the cp
group: the tiny GPT's), checks.py (the arguments, agreed on by every rank before any K/V
moves), stats.py (the block products and waiting time a rank counts). Only minipar's own
point-to-point and collectives move bytes. Importing this package imports torch.
"""

from minipar.parallel.context.attention import ContextParallelSelfAttention
from minipar.parallel.context.layout import shard_sequence, unshard_sequence
from minipar.parallel.context.ring import ring_attention
from minipar.parallel.context.stats import ContextStats
from minipar.parallel.context.ulysses import ulysses_attention

__all__ = [
    "ContextParallelSelfAttention",
    "ContextStats",
    "ring_attention",
    "shard_sequence",
    "ulysses_attention",
    "unshard_sequence",
]
