"""Tensor parallelism, the Megatron-LM way: one layer's matrix products split across ranks.

    from minipar.parallel.tensor import ColumnParallelLinear, RowParallelLinear, ParallelMLP
    mlp = ParallelMLP.from_dense(dense_mlp, group=tp_group)   # this rank's slice of the weights

One idea per file: plan.py (the layout as data: how each style of layer cuts its dense
tensors, read by every from_dense and by the GPT's sharding), operators.py (Megatron's f and g
and the sequence-parallel pair),
linear.py (column- and row-parallel linear layers), embedding.py (vocabulary-parallel
embedding), head.py (the column-parallel output layer over the vocabulary; both pad a
vocabulary the group does not divide, Megatron's way: plan.py's vocab cut),
cross_entropy.py (cross-entropy on vocabulary-split logits), mlp.py and
attention.py (the two halves of a transformer layer), sequence_parallel.py (the gradient sum
sequence parallelism adds), dense.py (the single-device twins every parallel layer is checked
against; each parallel layer's `from_dense` keeps this rank's slice of its twin's weights).
Importing this package imports torch.
"""

from minipar.parallel.tensor.attention import ParallelSelfAttention
from minipar.parallel.tensor.cross_entropy import vocab_parallel_cross_entropy
from minipar.parallel.tensor.dense import DenseMLP, DenseSelfAttention
from minipar.parallel.tensor.embedding import VocabParallelEmbedding
from minipar.parallel.tensor.head import VocabParallelHead
from minipar.parallel.tensor.linear import ColumnParallelLinear, RowParallelLinear
from minipar.parallel.tensor.mlp import ParallelMLP
from minipar.parallel.tensor.operators import (
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)
from minipar.parallel.tensor.plan import padded_vocab
from minipar.parallel.tensor.sequence_parallel import (
    mark_sequence_parallel,
    sync_sequence_parallel_grads,
)

__all__ = [
    "ColumnParallelLinear",
    "DenseMLP",
    "DenseSelfAttention",
    "ParallelMLP",
    "ParallelSelfAttention",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "VocabParallelHead",
    "copy_to_tensor_parallel_region",
    "gather_from_sequence_parallel_region",
    "gather_from_tensor_parallel_region",
    "mark_sequence_parallel",
    "padded_vocab",
    "reduce_from_tensor_parallel_region",
    "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region",
    "scatter_to_tensor_parallel_region",
    "sync_sequence_parallel_grads",
    "vocab_parallel_cross_entropy",
]
