"""Buffers: the numpy arrays and torch tensors that minipar moves, seen as flat runs of elements.

Collectives work on 1-D views of the caller's memory, so slicing a chunk (`x[a:b]`) is free and
writes land in the caller's tensor. torch is never imported here: a torch tensor can only exist if
the caller imported torch already, so `sys.modules` tells us whether to look for one.

Policy for awkward inputs (documented in docs/errors.md and tested):
- non-contiguous arrays and tensors are refused with a ValueError (a silent copy would make an
  in-place collective or a receive write into memory the caller never sees);
- read-only numpy arrays are refused as destinations;
- numpy arrays of Python objects (dtype object) are refused with a TypeError;
- anything that is not a numpy array or torch tensor is refused with a TypeError naming its type.
"""

from __future__ import annotations

import sys

import numpy as np


def torch_module():
    """torch, if the caller imported it (never imported here), else None."""
    return sys.modules.get("torch")


def is_torch(x) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def is_cuda(x) -> bool:
    return is_torch(x) and x.is_cuda


def check(x, what: str = "buffer", writable: bool = False) -> None:
    """Raise a clear error unless `x` is a contiguous numpy array or torch tensor."""
    if isinstance(x, np.ndarray):
        if x.dtype.hasobject:
            raise TypeError(
                f"{what} is a numpy array of dtype {x.dtype} (Python objects); minipar moves "
                "the raw bytes of numeric and bool arrays only"
            )
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
    """A 1-D view of all of `x`'s elements (no copy). A torch tensor is detached first: like
    torch.distributed, collectives write into a tensor that requires grad without autograd
    seeing it (else an in-place reduction would fail half-way through a collective)."""
    if type(x) is np.ndarray:
        return x if x.ndim == 1 else x.reshape(-1)
    if is_torch(x):
        x = x.detach()
        return x.as_strided((x.numel(),), (1,))  # stride 1 even for 0- and 1-element tensors
    return x.reshape(-1)


def numel(x) -> int:
    return x.numel() if is_torch(x) else x.size


def itemsize(x) -> int:
    return x.element_size() if is_torch(x) else x.itemsize


def nbytes(x) -> int:
    if isinstance(x, np.ndarray):  # the common case, on every message: keep it cheap
        return x.nbytes
    return numel(x) * itemsize(x)


_DTYPE_NAMES: dict = {}  # str(numpy dtype) takes microseconds; every collective call asks


def dtype_name(x) -> str:
    """'float32', 'bfloat16', 'int8', ... the same name for numpy and torch."""
    name = _DTYPE_NAMES.get(x.dtype)
    if name is None:
        name = _DTYPE_NAMES[x.dtype] = str(x.dtype).removeprefix("torch.")
    return name


def device_name(x) -> str:
    return str(x.device) if is_torch(x) else "cpu"


def is_floating(x) -> bool:
    if is_torch(x):
        return x.is_floating_point() or x.is_complex()
    return np.issubdtype(x.dtype, np.inexact)


def empty(x, n: int):
    """A new 1-D buffer of n elements with x's dtype and device."""
    if is_torch(x):
        return torch_module().empty(n, dtype=x.dtype, device=x.device)
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


def overlaps(a, b) -> bool:
    """Whether two contiguous buffers of the same kind share any byte of memory."""
    if nbytes(a) == 0 or nbytes(b) == 0 or is_torch(a) != is_torch(b):
        return False
    if not is_torch(a):
        return np.may_share_memory(a, b)  # exact for contiguous arrays (it compares extents)
    if a.device != b.device:
        return False
    return a.data_ptr() < b.data_ptr() + nbytes(b) and b.data_ptr() < a.data_ptr() + nbytes(a)


def byte_view(x):
    """x's bytes as a 1-D uint8 buffer of the same kind and device (a torch tensor stays one)."""
    if is_torch(x):
        return x.as_strided((x.numel(),), (1,)).view(torch_module().uint8)
    return x.reshape(-1).view(np.uint8)


def as_bytes(x):
    """The bytes of a contiguous CPU buffer as a 1-D uint8 numpy array (zero copy).

    This is how every dtype crosses MPI, bfloat16 included: MPI has no bfloat16, and the receiver
    reinterprets the bytes in its own buffer's dtype.
    """
    view = byte_view(x)  # stride 1 even for 0- and 1-element tensors
    return view.numpy() if is_torch(x) else view


def describe(x) -> str:
    """'torch.Tensor[float32, 1024, cpu]' for error messages and traces."""
    kind = "torch.Tensor" if is_torch(x) else "numpy.ndarray"
    return f"{kind}[{dtype_name(x)}, {tuple(x.shape)}, {device_name(x)}]"
