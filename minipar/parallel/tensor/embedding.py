"""VocabParallelEmbedding: the embedding table split by rows (the vocabulary) across a group.

The table of V rows is padded to Vp = padded_vocab(V, p, vocab_multiple) rows (plan.py, the
vocab cut; Vp = V when p divides it and vocab_multiple is 1) and rank r holds rows
r*Vp/p:(r+1)*Vp/p. Each rank looks up the ids that fall in its real rows, writes zeros for the
others, and g all-reduces the partial embeddings: exactly one rank contributed each row, so the
sum is the dense lookup. Forward: one all-reduce of (ids.numel() * dim) elements; backward:
none (g's backward is the identity; only rows this rank owns get gradient). The padded rows
(ids V..Vp-1) are zeros that no id looks up: they get no gradient and stay zero.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from minipar.parallel import replicas
from minipar.parallel.tensor import operators as ops
from minipar.parallel.tensor import plan
from minipar.parallel.tensor.linear import group_size_and_rank


class VocabParallelEmbedding(nn.Module):
    """nn.Embedding(num_embeddings, embedding_dim) with its rows split over `group`.

    vocab_multiple: the padded vocabulary is a multiple of vocab_multiple x p (Megatron's
    --make-vocab-size-divisible-by; 1, the default, pads only a vocabulary p does not divide).
    `padded_vocab_size` says how many rows the split table has."""

    style = "vocab"  # how from_dense cuts the dense table (plan.py)

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        group=None,
        vocab_multiple: int = plan.VOCAB_MULTIPLE,
    ):
        super().__init__()
        p, r = group_size_and_rank(group)
        self.num_embeddings, self.embedding_dim, self.group = num_embeddings, embedding_dim, group
        self.padded_vocab_size = plan.padded_vocab(num_embeddings, p, vocab_multiple)
        self.vocab_multiple = vocab_multiple
        rows = self.padded_vocab_size // p
        self.vocab_start, self.vocab_end = r * rows, (r + 1) * rows
        self.weight = nn.Parameter(torch.empty(rows, embedding_dim))
        replicas.mark_sharded(self.weight, group)  # rows: the gradient norm sums them
        nn.init.normal_(self.weight)  # nn.Embedding's default
        with torch.no_grad():
            self.weight[self.real_rows :] = 0.0

    @property
    def real_rows(self) -> int:
        """How many of this rank's rows are vocabulary (the rest is padding)."""
        return max(0, min(self.vocab_end, self.num_embeddings) - self.vocab_start)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_start + self.real_rows)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        partial = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return ops.reduce_from_tensor_parallel_region(partial, self.group)

    @classmethod
    def from_dense(
        cls, dense: nn.Embedding, group=None, vocab_multiple: int = plan.VOCAB_MULTIPLE
    ) -> VocabParallelEmbedding:
        """This rank's contiguous slice of `dense`'s rows (padded with zero rows)."""
        if not isinstance(dense, nn.Embedding):
            raise TypeError(f"{cls.__name__}.from_dense takes an nn.Embedding, got {type(dense)}")
        layer = cls(dense.num_embeddings, dense.embedding_dim, group, vocab_multiple)
        p, r = group_size_and_rank(group)
        return plan.load_(layer, cls.style, dense, r, p, vocab_multiple)

    def extra_repr(self) -> str:
        rows = self.weight.shape[0]
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, "
            f"{padding_words(self.padded_vocab_size, self.vocab_multiple, self.group)}, "
            f"this rank: rows {self.vocab_start}:{self.vocab_end}"
            f"{f' of which {rows - self.real_rows} padding' if rows > self.real_rows else ''}"
        )


def padding_words(padded: int, multiple: int, group) -> str:
    """'padded_vocab_size=68 (a multiple of 1 x tp=4)': the padded size, stated."""
    p = group_size_and_rank(group)[0]
    return f"padded_vocab_size={padded} (a multiple of {multiple} x tp={p})"
