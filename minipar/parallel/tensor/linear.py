"""Column- and row-parallel linear layers (Megatron-LM, section 3): Y = X A^T + b with A split
across the ranks of a group, torch's layout kept (`weight` is (out_features, in_features)).

    ColumnParallelLinear: rank r holds rows r*o/p:(r+1)*o/p of weight and bias (a slice of the
        OUTPUT features). Forward needs no communication: every rank has all of X and computes
        its own output columns. Backward: each rank's dX is partial (it saw only its columns),
        so f all-reduces it: b*s*in elements.
    RowParallelLinear: rank r holds columns r*i/p:(r+1)*i/p of weight (a slice of the INPUT
        features) and the full bias. Forward: each rank's X_r A_r^T is a partial sum of Y, so g
        all-reduces it (b*s*out elements), then the bias is added once. Backward needs none.

Column then row (the MLP, attention) costs one all-reduce forward and one backward. With
sequence_parallel=True the input of a column layer and the output of a row layer are sharded
along the sequence (dimension 1): the column layer all-gathers it forward (reduce-scatters dX
backward) and the row layer reduce-scatters (all-gathers backward): the same bytes, and the
activations between blocks are 1/p the size. Parameters whose gradient is then a partial sum
over this rank's sequence slice (the row layer's bias) carry `sequence_parallel = True`;
`sync_sequence_parallel_grads` (sequence_parallel.py) all-reduces them.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from minipar import runtime
from minipar.parallel import replicas
from minipar.parallel.tensor import operators as ops
from minipar.parallel.tensor import plan


def group_size_and_rank(group) -> tuple[int, int]:
    return runtime.get_world_size(group), runtime.get_rank(group)


def _init_(weight: torch.Tensor, bias, fan_in: int) -> None:
    """nn.Linear's default initialisation, with the full layer's fan-in."""
    bound = 1 / math.sqrt(fan_in) if fan_in else 0
    with torch.no_grad():
        weight.uniform_(-bound, bound)
        if bias is not None:
            bias.uniform_(-bound, bound)


def _check_dense(dense, what: str) -> None:
    if not isinstance(dense, nn.Linear):
        raise TypeError(f"{what}.from_dense takes an nn.Linear, got {type(dense).__name__}")


class ColumnParallelLinear(nn.Module):
    """Y = X A^T + b with the output features split: this rank computes Y[..., its slice].

    gather_output=True all-gathers Y along the last dimension (every rank gets all of Y).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        gather_output: bool = False,
        group=None,
        sequence_parallel: bool = False,
    ):
        super().__init__()
        p, _ = group_size_and_rank(group)
        ops.check_divisible(out_features, p, "out_features")
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.group, self.sequence_parallel = (
            gather_output,
            group,
            sequence_parallel,
        )
        self.weight = nn.Parameter(torch.empty(out_features // p, in_features))
        self.bias = nn.Parameter(torch.empty(out_features // p)) if bias else None
        replicas.mark_sharded(self.parameters(), group)  # slices: the gradient norm sums them
        _init_(self.weight, self.bias, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            x = ops.gather_from_sequence_parallel_region(x, self.group)
        else:
            x = ops.copy_to_tensor_parallel_region(x, self.group)  # f
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output:
            y = ops.gather_from_tensor_parallel_region(y, self.group)
        return y

    style = "colwise"  # how from_dense cuts the dense weights (plan.py)

    @classmethod
    def from_dense(cls, dense: nn.Linear, group=None, **kwargs) -> ColumnParallelLinear:
        """This rank's contiguous slice of `dense`'s rows (weight and bias)."""
        _check_dense(dense, cls.__name__)
        layer = cls(
            dense.in_features, dense.out_features, dense.bias is not None, group=group, **kwargs
        )
        return plan.load_(layer, cls.style, dense, *reversed(group_size_and_rank(group)))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features} "
            f"(this rank: {self.weight.shape[0]}), bias={self.bias is not None}, "
            f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel}"
        )


class RowParallelLinear(nn.Module):
    """Y = X A^T + b with the input features split: this rank computes X_r A_r^T, the group sums.

    input_is_parallel=False: X is full and this rank keeps its slice of the last dimension first
    (not allowed with sequence parallelism: there the input must already be split).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        input_is_parallel: bool = True,
        group=None,
        sequence_parallel: bool = False,
    ):
        super().__init__()
        p, _ = group_size_and_rank(group)
        ops.check_divisible(in_features, p, "in_features")
        if sequence_parallel and not input_is_parallel:
            raise ValueError(
                "RowParallelLinear with sequence_parallel=True needs input_is_parallel=True "
                "(its input comes split from a column-parallel layer)"
            )
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel, self.group = input_is_parallel, group
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(torch.empty(out_features, in_features // p))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        if self.bias is not None and sequence_parallel:
            self.bias.sequence_parallel = True  # its gradient covers this rank's tokens only
        replicas.mark_sharded(self.weight, group)  # the bias, whole on every rank, is a copy
        _init_(self.weight, self.bias, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = ops.scatter_to_tensor_parallel_region(x, self.group)
        partial = F.linear(x, self.weight)  # no bias yet: it must be added once, not p times
        if self.sequence_parallel:
            y = ops.reduce_scatter_to_sequence_parallel_region(partial, self.group)
        else:
            y = ops.reduce_from_tensor_parallel_region(partial, self.group)  # g
        return y + self.bias if self.bias is not None else y

    style = "rowwise"  # how from_dense cuts the dense weights (plan.py)

    @classmethod
    def from_dense(cls, dense: nn.Linear, group=None, **kwargs) -> RowParallelLinear:
        """This rank's contiguous slice of `dense`'s weight columns, and the full bias."""
        _check_dense(dense, cls.__name__)
        layer = cls(
            dense.in_features, dense.out_features, dense.bias is not None, group=group, **kwargs
        )
        return plan.load_(layer, cls.style, dense, *reversed(group_size_and_rank(group)))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features} (this rank: {self.weight.shape[1]}), "
            f"out_features={self.out_features}, bias={self.bias is not None}, "
            f"input_is_parallel={self.input_is_parallel}, "
            f"sequence_parallel={self.sequence_parallel}"
        )
