"""CUDA tensors and MPI: is the loaded MPI CUDA-aware, and if not, stage through pinned host memory.

A CUDA-aware MPI reads and writes device memory itself (over NVLink, or GPUDirect RDMA across
nodes). Otherwise each message is copied device -> pinned host buffer -> MPI -> pinned host
buffer -> device. Either way the current CUDA stream is synchronized first: MPI knows nothing of
streams, and a kernel still writing the tensor would race with the send.

Detection asks the MPI library that mpi4py loaded, through ctypes:
- MPICH >= 4: `MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)`;
- Open MPI and MPICH: `MPIX_Query_cuda_support()`.
`MINIPAR_CUDA_AWARE=1` or `=0` overrides it (for an MPI that answers wrongly or not at all).
"""

from __future__ import annotations

import ctypes
import functools
import os

from minipar.comm.setup.mpisetup import loaded_mpi_library  # (its home: no numpy for the launcher)
from minipar.comm.transport import buffers

MPIX_GPU_SUPPORT_CUDA = 0


@functools.cache
def mpi_cuda_aware() -> tuple[bool, str]:
    """(yes or no, why), for `minipar doctor` and for choosing direct or staged transfers."""
    override = os.environ.get("MINIPAR_CUDA_AWARE")
    if override in ("0", "1"):
        return override == "1", f"MINIPAR_CUDA_AWARE={override} set in the environment"
    path = loaded_mpi_library()
    if path is None:
        return False, "could not find the loaded libmpi to ask"
    lib = ctypes.CDLL(path)
    if hasattr(lib, "MPIX_GPU_query_support"):
        flag = ctypes.c_int(0)
        lib.MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, ctypes.byref(flag))
        why = f"MPIX_GPU_query_support(CUDA) in {os.path.basename(path)} returned {flag.value}"
        return bool(flag.value), why
    if hasattr(lib, "MPIX_Query_cuda_support"):
        flag = lib.MPIX_Query_cuda_support()
        return bool(flag), f"MPIX_Query_cuda_support() in {os.path.basename(path)} returned {flag}"
    return False, f"{os.path.basename(path)} has no MPIX CUDA query; assuming not CUDA-aware"


def synchronize(x) -> None:
    """Wait for the current stream's work on x's device, so MPI sees the finished bytes."""
    if buffers.is_cuda(x):
        buffers.torch_module().cuda.current_stream(x.device).synchronize()


class PinnedPool:
    """Reusable pinned host buffers, one per size class, for staging device <-> host copies."""

    def __init__(self):
        self._free: dict[int, list] = {}

    def take(self, nbytes: int):
        torch = buffers.torch_module()
        size = 1 << max(nbytes - 1, 0).bit_length()  # round up to a power of two
        stack = self._free.setdefault(size, [])
        block = stack.pop() if stack else torch.empty(size, dtype=torch.uint8, pin_memory=True)
        return block[:nbytes]

    def give(self, view) -> None:
        base = view._base if view._base is not None else view
        self._free.setdefault(base.numel(), []).append(base)
