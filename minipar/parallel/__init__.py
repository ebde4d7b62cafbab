"""Parallel strategies built on minipar's own collectives and point-to-point transport.

    from minipar.parallel import DistributedDataParallel, ZeroRedundancyOptimizer
    from minipar.parallel import FullyShardedDataParallel, DeviceMesh
    from minipar.parallel.tensor import ColumnParallelLinear, RowParallelLinear
    from minipar.parallel.pipeline import Pipeline, split
    from minipar.parallel import clip_grad_norm_   # the whole mesh's gradient norm, one clip

One folder per axis: data/ (DDP, ZeRO-1, FSDP), tensor/, pipeline/, context/ (ring attention
and Ulysses), expert/ (mixture of experts); mesh.py combines them (dp x cp x tp x pp, and the
expert-parallel groups laid over dp).
Importing this package imports torch. The modules of data/ were once minipar.parallel.ddp, .zero
and .fsdp: those names still import (the README says so).
"""

import sys

from minipar.parallel import data
from minipar.parallel.clip_grad import clip_grad_norm_
from minipar.parallel.data import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    ZeroRedundancyOptimizer,
)
from minipar.parallel.mesh import DeviceMesh

for _old in ("ddp", "zero", "fsdp"):  # the old paths, kept for programs that import them
    sys.modules[f"{__name__}.{_old}"] = getattr(data, _old)

__all__ = [
    "DeviceMesh",
    "clip_grad_norm_",
    "DistributedDataParallel",
    "FullyShardedDataParallel",
    "ZeroRedundancyOptimizer",
]
