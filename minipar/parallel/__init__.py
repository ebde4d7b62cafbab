"""Parallel strategies built on minipar's own collectives and point-to-point transport.

    from minipar.parallel import DistributedDataParallel, ZeroRedundancyOptimizer
    from minipar.parallel import FullyShardedDataParallel, DeviceMesh
    from minipar.parallel.tensor import ColumnParallelLinear, RowParallelLinear
    from minipar.parallel.pipeline import Pipeline, split

One folder or file per strategy: data parallelism (ddp.py, zero.py, fsdp.py), tensor parallelism
(tensor/), pipeline parallelism (pipeline/), and the mesh that combines them (mesh.py). Importing
this package is light: each name is loaded (with torch) on first use.
"""

from __future__ import annotations

from minipar import lazy

_LAZY = {
    "DistributedDataParallel": "minipar.parallel.ddp",
    "ZeroRedundancyOptimizer": "minipar.parallel.zero",
    "FullyShardedDataParallel": "minipar.parallel.fsdp",
    "DeviceMesh": "minipar.parallel.mesh",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy.attributes(__name__, _LAZY)
