"""Tensor parallelism, the Megatron-LM way: one layer's matrix products split across ranks.

The dense twins (dense.py) are the single-device modules every parallel layer is checked
against; each parallel layer's `from_dense` keeps this rank's slice of its twin's weights.
"""

from minipar.parallel.tensor.dense import DenseMLP, DenseSelfAttention

__all__ = ["DenseMLP", "DenseSelfAttention"]
