# Generated from solutions/ex06_column_row_parallel.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 06`.
# The grader admits these imports here (others it refuses, naming the line):
#   minipar, torch
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 06, column- and row-parallel linear layers by hand (lesson 06: tensor parallelism).

A linear layer is y = x W^T + b with W of shape (out, in), torch's layout. Over a group of p
ranks, rank r holds:

  column split: rows r*out/p .. (r+1)*out/p of W and of b (its slice of the OUTPUT features);
  row split:    columns r*in/p .. (r+1)*in/p of W (its slice of the INPUT features), all of b.

Write each layer's forward and backward without autograd. Inputs are (..., features); the
gradients of W and b sum over every leading dimension (batch, sequence). Communicate only with
`minipar.all_reduce(tensor, group=group)` (in place, on a contiguous tensor), and only where
the math needs it: the grader reads the trace ledger and expects

  column forward: nothing (every rank has all of x)
  column backward: one all-reduce (each rank's grad_x is a partial sum over its rows of W)
  row forward: one all-reduce (each rank's product is a partial sum), bias added once, after
  row backward: nothing (grad_y is whole on every rank)

A failure names the layer and direction (column or row, forward or backward), and first the
collectives it made against these (f: the identity forward, an all-reduce of grad_x backward;
g: an all-reduce of the output forward, the identity backward, as Megatron-LM names them),
then the first element off against torch autograd on the whole layer (relative error 1e-5) and
the rank's shard: rows r out/p .. (r+1) out/p of W for a column layer, columns r in/p .. of W
(and of x) for a row layer.

Grade it: minipar grade 06
"""

import torch

import minipar


def _flat(t: torch.Tensor) -> torch.Tensor:
    """(..., features) -> (tokens, features)."""
    return t.reshape(-1, t.shape[-1])


def column_forward(x, weight, bias=None):
    """This rank's output features: x (..., in), weight (out/p, in) -> (..., out/p)."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")


def column_backward(grad_y, x, weight, group=None):
    """(grad_x, grad_weight, grad_bias) for grad_y (..., out/p); grad_x (..., in) is the full
    gradient (summed over the group), the others this rank's slices."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")


def row_forward(x_part, weight, bias=None, group=None):
    """x_part (..., in/p), this rank's input features; weight (out, in/p); bias (out,) or None.
    Returns the full output (..., out), the same on every rank."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")


def row_backward(grad_y, x_part, weight):
    """(grad_x_part, grad_weight, grad_bias) for grad_y (..., out): this rank's slices, and the
    full bias gradient."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
