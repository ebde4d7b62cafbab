"""VocabParallelHead: the output layer to the vocabulary, column-parallel, over a padded
vocabulary (Megatron's output layer: a ColumnParallelLinear of padded-vocabulary width).

    head = VocabParallelHead.from_dense(dense_linear, group)   # (hidden -> V), V any size
    logits = head(x)                 # (..., Vp/p): this rank's slice; padded columns -inf
    loss = vocab_parallel_cross_entropy(logits, targets, group)

Weight rows (the output features) are the vocabulary, cut as the embedding's table is (plan.py,
the vocab cut): V padded to Vp = padded_vocab(V, p, vocab_multiple), rank r holding rows
r*Vp/p:(r+1)*Vp/p, the padding zero rows at the end. Communication is the column layer's: none
forward (f's identity), one all-reduce of dX backward; with gather_output an all-gather of the
logits, whose padding is then dropped (the dense layer's V columns come back).

The padded columns' logits are set to -inf, not left at 0: a 0 would win an argmax over
negative logits and take a share of the softmax. At -inf their probability is exactly 0, so the
loss is the unpadded model's, their gradient is 0 and the padded weight rows get none.
"""

from __future__ import annotations

import torch
from torch import nn

from minipar.parallel.tensor import operators as ops
from minipar.parallel.tensor import plan
from minipar.parallel.tensor.embedding import padding_words
from minipar.parallel.tensor.linear import ColumnParallelLinear, group_size_and_rank


class VocabParallelHead(ColumnParallelLinear):
    """Logits = X W^T (+ b) for a vocabulary of `vocab_size`, this rank's padded slice of it.

    vocab_multiple: the padded vocabulary is a multiple of vocab_multiple x p (1, the default,
    pads only a vocabulary p does not divide). `padded_vocab_size` says how wide it is."""

    style = "vocab"  # how from_dense cuts the dense weights (plan.py)

    def __init__(
        self,
        in_features: int,
        vocab_size: int,
        bias: bool = False,
        gather_output: bool = False,
        group=None,
        sequence_parallel: bool = False,
        vocab_multiple: int = plan.VOCAB_MULTIPLE,
    ):
        p, r = group_size_and_rank(group)
        padded = plan.padded_vocab(vocab_size, p, vocab_multiple)
        super().__init__(in_features, padded, bias, False, group, sequence_parallel)
        self.out_features = self.vocab_size = vocab_size  # the dense layer's
        self.padded_vocab_size, self.vocab_multiple = padded, vocab_multiple
        self.gather_logits = gather_output
        rows = padded // p
        self.vocab_start = r * rows
        self.real_rows = max(0, min(rows, vocab_size - self.vocab_start))
        with torch.no_grad():
            self.weight[self.real_rows :] = 0.0
            if self.bias is not None:
                self.bias[self.real_rows :] = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)  # (..., Vp/p)
        if self.real_rows < y.shape[-1]:
            padding = torch.arange(y.shape[-1], device=y.device) >= self.real_rows
            y = y.masked_fill(padding, float("-inf"))
        if self.gather_logits:
            y = ops.gather_from_tensor_parallel_region(y, self.group)[..., : self.vocab_size]
        return y

    @classmethod
    def from_dense(
        cls, dense: nn.Linear, group=None, vocab_multiple: int = plan.VOCAB_MULTIPLE, **kwargs
    ) -> VocabParallelHead:
        """This rank's contiguous slice of `dense`'s rows (weight and bias), padded."""
        if not isinstance(dense, nn.Linear):
            raise TypeError(f"{cls.__name__}.from_dense takes an nn.Linear, got {type(dense)}")
        layer = cls(
            dense.in_features,
            dense.out_features,
            dense.bias is not None,
            group=group,
            vocab_multiple=vocab_multiple,
            **kwargs,
        )
        p, r = group_size_and_rank(group)
        return plan.load_(layer, cls.style, dense, r, p, vocab_multiple)

    def extra_repr(self) -> str:
        rows = self.weight.shape[0]
        return (
            f"in_features={self.in_features}, vocab_size={self.vocab_size}, "
            f"{padding_words(self.padded_vocab_size, self.vocab_multiple, self.group)}, "
            f"this rank: rows {self.vocab_start}:{self.vocab_start + rows}"
            f"{f' of which {rows - self.real_rows} padding' if rows > self.real_rows else ''}, "
            f"bias={self.bias is not None}, gather_output={self.gather_logits}, "
            f"sequence_parallel={self.sequence_parallel}"
        )
