"""Buffers: the numpy arrays and torch tensors that minipar moves, seen as flat runs of elements.

Collectives work on 1-D views of the caller's memory, so slicing a chunk (`x[a:b]`) is free and
writes land in the caller's tensor. torch is never imported here: a torch tensor can only exist if
the caller imported torch already, so `sys.modules` tells us whether to look for one.

Policy for awkward inputs (documented in docs/errors.md and tested):
- non-contiguous arrays and tensors are refused with a ValueError (a silent copy would make an
  in-place collective or a receive write into memory the caller never sees);
- read-only numpy arrays are refused as destinations;
- anything that is not a numpy array or torch tensor is refused with a TypeError naming its type.
"""

from __future__ import annotations

import sys

import numpy as np


def _torch():
    return sys.modules.get("torch")


def is_torch(x) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_cuda(x) -> bool:
    return is_torch(x) and x.is_cuda


def check(x, what: str = "buffer", writable: bool = False) -> None:
    """Raise a clear error unless `x` is a contiguous numpy array or torch tensor."""
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ValueError(
                f"{what} is a non-contiguous numpy array (strides {x.strides}); "
                "pass np.ascontiguousarray(x) instead"
            )
        if writable and not x.flags.writeable:
            raise ValueError(f"{what} is a read-only numpy array; it must be writable")
        return
    if is_torch(x):
        if not x.is_contiguous():
            raise ValueError(
                f"{what} is a non-contiguous torch tensor (stride {tuple(x.stride())}); "
                "pass x.contiguous() instead"
            )
        return
    raise TypeError(
        f"{what} must be a numpy.ndarray or torch.Tensor, got {type(x).__module__}."
        f"{type(x).__qualname__}"
    )


def flat(x):
    """A 1-D view of all of `x`'s elements (no copy)."""
    return x.reshape(-1)


def numel(x) -> int:
    return x.numel() if is_torch(x) else x.size


def itemsize(x) -> int:
    return x.element_size() if is_torch(x) else x.itemsize


def nbytes(x) -> int:
    return numel(x) * itemsize(x)


def dtype_name(x) -> str:
    """'float32', 'bfloat16', 'int8', ... the same name for numpy and torch."""
    return str(x.dtype).removeprefix("torch.")


def device_name(x) -> str:
    return str(x.device) if is_torch(x) else "cpu"


def is_floating(x) -> bool:
    if is_torch(x):
        return x.is_floating_point() or x.is_complex()
    return np.issubdtype(x.dtype, np.inexact)


def empty(x, n: int):
    """A new 1-D buffer of n elements with x's dtype and device."""
    if is_torch(x):
        return _torch().empty(n, dtype=x.dtype, device=x.device)
    return np.empty(n, dtype=x.dtype)


def copy_(dst, src) -> None:
    """dst[:] = src, for two buffers of the same kind, dtype and length."""
    if is_torch(dst):
        dst.copy_(src)
    else:
        np.copyto(dst, src)


def same_kind(a, b) -> bool:
    """Both numpy, or both torch on the same device."""
    if is_torch(a) != is_torch(b):
        return False
    return not is_torch(a) or a.device == b.device


def as_bytes(x):
    """The bytes of a contiguous CPU buffer as a 1-D uint8 numpy array (zero copy).

    This is how every dtype crosses MPI, bfloat16 included: MPI has no bfloat16, and the receiver
    reinterprets the bytes in its own buffer's dtype.
    """
    if is_torch(x):
        torch = _torch()
        return x.reshape(-1).view(torch.uint8).numpy()
    return x.reshape(-1).view(np.uint8)


def describe(x) -> str:
    """'torch.Tensor[float32, 1024, cpu]' for error messages and traces."""
    kind = "torch.Tensor" if is_torch(x) else "numpy.ndarray"
    return f"{kind}[{dtype_name(x)}, {tuple(x.shape)}, {device_name(x)}]"
