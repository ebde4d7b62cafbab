"""minipar: a from-scratch, educational distributed-training runtime.

    import minipar
    minipar.init()                          # MPI under mpiexec, torch under torchrun
    minipar.all_reduce(x, algorithm="ring")
    with minipar.trace() as t: ...

`import minipar` is light (no torch, no MPI, no numpy): each name below is loaded on first use,
from the layer that defines it (the README's map of the package says which folder is which).
"""

from __future__ import annotations

import importlib
import sys

__version__ = "0.1.0"

_LAZY = {
    # runtime
    "init": "minipar.runtime.world",
    "finalize": "minipar.runtime.world",
    "is_initialized": "minipar.runtime.world",
    "get_rank": "minipar.runtime.world",
    "get_world_size": "minipar.runtime.world",
    "get_backend": "minipar.runtime.world",
    "new_group": "minipar.runtime.world",
    "device": "minipar.runtime.devices",
    "local_rank": "minipar.runtime.devices",
    "local_world_size": "minipar.runtime.nodes",
    "node_rank": "minipar.runtime.nodes",
    "num_nodes": "minipar.runtime.nodes",
    "node_map": "minipar.runtime.nodes",
    # collectives
    "broadcast": "minipar.collectives.api",
    "all_reduce": "minipar.collectives.api",
    "reduce": "minipar.collectives.api",
    "all_gather_into_tensor": "minipar.collectives.api",
    "all_gather": "minipar.collectives.api",
    "reduce_scatter_tensor": "minipar.collectives.api",
    "scatter": "minipar.collectives.api",
    "gather": "minipar.collectives.api",
    "all_to_all_single": "minipar.collectives.api",
    "barrier": "minipar.collectives.api",
    "algorithms": "minipar.collectives.api",
    "register_algorithm": "minipar.collectives.api",
    "empty": "minipar.collectives.window_buffer",
    "Work": "minipar.collectives.work",
    # torch.distributed parity: point-to-point, object and list collectives, set-up
    "send": "minipar.collectives.p2p",
    "recv": "minipar.collectives.p2p",
    "isend": "minipar.collectives.p2p",
    "irecv": "minipar.collectives.p2p",
    "P2POp": "minipar.collectives.p2p",
    "batch_isend_irecv": "minipar.collectives.p2p",
    "broadcast_object_list": "minipar.collectives.objects",
    "all_gather_object": "minipar.collectives.objects",
    "gather_object": "minipar.collectives.objects",
    "scatter_object_list": "minipar.collectives.objects",
    "all_to_all": "minipar.collectives.lists",
    "reduce_scatter": "minipar.collectives.lists",
    "get_group_rank": "minipar.runtime.world",
    "get_global_rank": "minipar.runtime.world",
    "get_process_group_ranks": "minipar.runtime.world",
    "group": "minipar.runtime.world",
    "GroupMember": "minipar.runtime.world",
    "init_process_group": "minipar.runtime.process_group",
    "destroy_process_group": "minipar.runtime.process_group",
    "is_available": "minipar.runtime.process_group",
    # the rest
    "ReduceOp": "minipar.collectives.reduce_op",
    "reduce_op": "minipar.collectives.reduce_op",  # torch's old name of ReduceOp
    "trace": "minipar.comm.trace.ledger",
    "MiniparError": "minipar.errors",
    "CommTimeoutError": "minipar.errors",
    "MessageSizeError": "minipar.errors",
    "MismatchError": "minipar.errors",
    "NotInitializedError": "minipar.errors",
    # launching from a Python session or notebook; the MPI set-up diagnosed
    "launch": "minipar.launcher.notebook",
    "RankError": "minipar.errors",
    "MPISetupError": "minipar.errors",
}
_SUBMODULES = {
    # the layers, bottom up (each imports only from the ones before it)
    "errors": "minipar.errors",
    "state": "minipar.state",
    "cost": "minipar.cost",
    "comm": "minipar.comm",
    "runtime": "minipar.runtime",
    "launcher": "minipar.launcher",
    "collectives": "minipar.collectives",
    "parallel": "minipar.parallel",
    "models": "minipar.models",
    "planning": "minipar.planning",
    "exercises": "minipar.exercises",
    # where three helpers lived before the layers had folders
    "buffers": "minipar.comm.transport.buffers",
    "ledger": "minipar.comm.trace.ledger",
    "ops": "minipar.collectives.reduce_op",
}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)


def __getattr__(name: str):
    """PEP 562: a name loads its module (and so numpy, mpi4py or torch) the first time it is
    used, and is then kept in this package; a layer is imported on first access."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        setattr(sys.modules[__name__], name, value)
        return value
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
