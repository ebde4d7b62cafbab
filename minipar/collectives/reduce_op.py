"""Reduction operators: what `op=` means, and the one kernel every reducing collective calls.

Semantics match torch.distributed:
- SUM, PRODUCT: integers wrap around on overflow (two's complement, as numpy and torch do);
  on bool, SUM is logical or and PRODUCT logical and.
- MIN, MAX: elementwise; NaN propagates (numpy's `minimum`/`maximum`, torch's likewise);
  refused on complex dtypes, which have no order.
- AVG: SUM, then a division by the group size at the end. Floating point only: an integer
  average would have to round, and torch's NCCL and gloo disagree on how, so minipar refuses it.
- BAND, BOR, BXOR: bitwise and, or, xor; integer and bool dtypes only (a float's bits are not a
  number you meant to combine bit by bit). On bool they are logical and, or, xor.
Identical results on every rank: most algorithms reduce each element in one place and copy the
result. Where two ranks compute the same combination (recursive doubling), both must put the
operands in the same order: `a op b` and `b op a` differ in the last bits for MIN/MAX of -0.0 and
+0.0 and for NaN payloads, so `reduce_(..., reverse=True)` lets the higher rank compute
`incoming op mine`, exactly what its partner computes.
"""

from __future__ import annotations

import enum
import warnings

import numpy as np

from minipar.comm.transport import buffers


class ReduceOp(enum.Enum):
    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"

    # members are singletons compared by identity, so hash by identity too: in C, unlike Enum's
    # own __hash__ (a Python function): every collective call hashes its signature, op included
    __hash__ = object.__hash__


class _ReduceOpAlias:
    """torch's `dist.reduce_op`, the old spelling of ReduceOp that its distributed tutorial
    still uses (`dist.reduce_op.SUM`): the same members, with torch's FutureWarning on use."""

    def __getattr__(self, name: str):
        if name.startswith("_"):  # copy, pickle and friends probing: not a member
            raise AttributeError(name)
        warnings.warn(
            "`minipar.reduce_op` is deprecated (torch.distributed's old name), "
            "please use `minipar.ReduceOp` instead",
            FutureWarning,
            stacklevel=2,
        )
        try:
            return ReduceOp[name]
        except KeyError:
            raise AttributeError(f"reduce_op has no member {name!r}") from None

    def __dir__(self):
        return [m.name for m in ReduceOp]

    def __repr__(self) -> str:
        return "<minipar.reduce_op: the old name of minipar.ReduceOp>"


reduce_op = _ReduceOpAlias()

_NUMPY = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)
_SUM, _PRODUCT, _AVG = ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.AVG  # Enum.X costs ~1 us
_NUMPY_BOOL = {
    ReduceOp.SUM: np.logical_or,
    ReduceOp.PRODUCT: np.logical_and,
    ReduceOp.MIN: np.logical_and,
    ReduceOp.MAX: np.logical_or,
    ReduceOp.BAND: np.logical_and,
    ReduceOp.BOR: np.logical_or,
    ReduceOp.BXOR: np.logical_xor,
}


def numpy_kernel(op: ReduceOp, dtype):
    """The numpy ufunc that applies `op` to arrays of `dtype` (bool has logical ones)."""
    return (_NUMPY_BOOL if dtype == np.bool_ else _NUMPY)[op]


def as_op(op) -> ReduceOp:
    """Accept ReduceOp members, their names ('sum', 'SUM') and torch.distributed.ReduceOp."""
    if isinstance(op, ReduceOp):
        return op
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    try:
        return ReduceOp[name.upper()]
    except KeyError:
        choices = ", ".join(m.name for m in ReduceOp)
        raise ValueError(f"unknown reduction op {op!r}; choose one of {choices}") from None


def check_op(op: ReduceOp, x) -> None:
    """Refuse an op that has no meaning for x's dtype, naming both."""
    if op is _SUM or op is _PRODUCT:
        return  # every dtype sums and multiplies (the common case, checked by identity)
    if op is ReduceOp.AVG and not buffers.is_floating(x):
        raise ValueError(
            f"ReduceOp.AVG needs a floating-point dtype, got {buffers.dtype_name(x)} "
            "(use SUM and divide, choosing your own rounding)"
        )
    if op in (ReduceOp.MIN, ReduceOp.MAX) and buffers.dtype_name(x).startswith("complex"):
        raise ValueError(
            f"ReduceOp.{op.name} needs an ordered dtype, got {buffers.dtype_name(x)} "
            "(complex numbers have no order)"
        )
    if op in _BITWISE and buffers.is_floating(x):
        raise ValueError(
            f"ReduceOp.{op.name} needs an integer or bool dtype, got {buffers.dtype_name(x)} "
            "(bitwise operations have no meaning on floating-point values)"
        )


def reduce_(dst, src, op: ReduceOp, reverse: bool = False) -> None:
    """dst = dst (op) src elementwise, in place; with reverse, dst = src (op) dst.
    AVG reduces as SUM; see `finish_`."""
    a, b = (src, dst) if reverse else (dst, src)
    reduce_into(dst, a, b, op)


def reduce_into(dst, a, b, op: ReduceOp) -> None:
    """dst = a (op) b elementwise (dst may be a or b): one pass where a copy and a reduce_
    would make two."""
    if buffers.is_torch(dst):
        _reduce_torch(dst, a, b, op)
    elif dst.dtype == np.bool_:
        _NUMPY_BOOL[op](a, b, out=dst)
    else:
        _NUMPY[op](a, b, out=dst)


def _reduce_torch(dst, a, b, op: ReduceOp) -> None:
    torch = buffers.torch_module()
    if dst.dtype == torch.bool and op not in _BITWISE:
        kernel = torch.logical_or if op in (ReduceOp.SUM, ReduceOp.MAX) else torch.logical_and
    else:
        kernel = {
            ReduceOp.SUM: torch.add,
            ReduceOp.AVG: torch.add,
            ReduceOp.PRODUCT: torch.mul,
            ReduceOp.MIN: torch.minimum,
            ReduceOp.MAX: torch.maximum,
            ReduceOp.BAND: torch.bitwise_and,
            ReduceOp.BOR: torch.bitwise_or,
            ReduceOp.BXOR: torch.bitwise_xor,
        }[op]
    kernel(a, b, out=dst)


def finish_(x, op: ReduceOp, size: int) -> None:
    """The last touch of a reduction: AVG divides the summed buffer by the group size."""
    if op is _AVG and size > 1:
        if buffers.is_torch(x):
            x.div_(size)
        else:
            np.divide(x, size, out=x, casting="unsafe")
