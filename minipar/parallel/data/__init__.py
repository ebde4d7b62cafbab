"""Data parallelism: every rank holds the whole model and a slice of the batch (lesson 05).

    from minipar.parallel.data import DistributedDataParallel, ZeroRedundancyOptimizer
    from minipar.parallel.data import FullyShardedDataParallel

ddp.py   gradients all-reduced in buckets during backward (torch's DistributedDataParallel)
zero.py  ZeRO-1: each rank keeps and updates 1/p of the optimizer state, then broadcasts
fsdp.py  ZeRO-3: parameters sharded too, gathered per unit for forward and backward
"""

from minipar.parallel.data.ddp import DistributedDataParallel
from minipar.parallel.data.fsdp import FullyShardedDataParallel
from minipar.parallel.data.zero import ZeroRedundancyOptimizer

__all__ = ["DistributedDataParallel", "FullyShardedDataParallel", "ZeroRedundancyOptimizer"]
