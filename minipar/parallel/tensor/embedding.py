"""VocabParallelEmbedding: the embedding table split by rows (the vocabulary) across a group.

Rank r holds rows r*V/p:(r+1)*V/p. Each rank looks up the ids that fall in its slice, writes
zeros for the others, and g all-reduces the partial embeddings: exactly one rank contributed
each row, so the sum is the dense lookup. Forward: one all-reduce of (ids.numel() * dim)
elements; backward: none (g's backward is the identity; only rows this rank owns get gradient).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from minipar.parallel.tensor import operators as ops
from minipar.parallel.tensor import plan
from minipar.parallel.tensor.linear import group_size_and_rank


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, group=None):
        super().__init__()
        p, r = group_size_and_rank(group)
        ops.check_divisible(num_embeddings, p, "num_embeddings (the vocabulary)")
        self.num_embeddings, self.embedding_dim, self.group = num_embeddings, embedding_dim, group
        rows = num_embeddings // p
        self.vocab_start, self.vocab_end = r * rows, (r + 1) * rows
        self.weight = nn.Parameter(torch.empty(rows, embedding_dim))
        nn.init.normal_(self.weight)  # nn.Embedding's default

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        partial = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return ops.reduce_from_tensor_parallel_region(partial, self.group)

    style = "vocab"  # how from_dense cuts the dense table (plan.py)

    @classmethod
    def from_dense(cls, dense: nn.Embedding, group=None) -> VocabParallelEmbedding:
        """This rank's contiguous slice of `dense`'s rows."""
        if not isinstance(dense, nn.Embedding):
            raise TypeError(f"{cls.__name__}.from_dense takes an nn.Embedding, got {type(dense)}")
        layer = cls(dense.num_embeddings, dense.embedding_dim, group)
        return plan.load_(layer, cls.style, dense, *reversed(group_size_and_rank(group)))

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim} "
            f"(this rank: rows {self.vocab_start}:{self.vocab_end})"
        )
