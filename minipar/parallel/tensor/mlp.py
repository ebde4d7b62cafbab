"""ParallelMLP: the transformer MLP split Megatron's way, column-parallel fc1 then row-parallel
fc2, so the GeLU between them runs on this rank's slice of the ffn features with no
communication.

    x --f--> fc1 (rows of A: ffn/p features) -> GeLU -> fc2 (columns of B) --g--> y

Communication per call: one all-reduce of the (batch, seq, hidden) output forward (g), one of
the input's gradient backward (f), b*s*h elements each. With sequence parallelism: one
all-gather and one reduce-scatter each way, the same bytes.
"""

from __future__ import annotations

from torch import nn

from minipar.parallel.tensor.dense import DenseMLP
from minipar.parallel.tensor.linear import ColumnParallelLinear, RowParallelLinear


class ParallelMLP(nn.Module):
    """The tensor-parallel twin of DenseMLP (same attribute names: fc1, act, fc2)."""

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        bias: bool = True,
        group=None,
        sequence_parallel: bool = False,
    ):
        super().__init__()
        self.fc1 = ColumnParallelLinear(
            hidden_size, ffn_hidden_size, bias, group=group, sequence_parallel=sequence_parallel
        )
        self.act = nn.GELU()
        self.fc2 = RowParallelLinear(
            ffn_hidden_size, hidden_size, bias, group=group, sequence_parallel=sequence_parallel
        )

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))

    @classmethod
    def from_dense(cls, dense: DenseMLP, group=None, sequence_parallel: bool = False):
        """This rank's slices of a DenseMLP: fc1's rows, fc2's columns and full bias."""
        if not isinstance(dense, DenseMLP):
            raise TypeError(f"ParallelMLP.from_dense takes a DenseMLP, got {type(dense)}")
        mlp = cls(dense.fc1.in_features, dense.fc1.out_features, dense.fc1.bias is not None, group)
        mlp.fc1 = ColumnParallelLinear.from_dense(
            dense.fc1, group, sequence_parallel=sequence_parallel
        )
        mlp.fc2 = RowParallelLinear.from_dense(
            dense.fc2, group, sequence_parallel=sequence_parallel
        )
        return mlp
