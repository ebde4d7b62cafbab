"""minipar: a from-scratch, educational distributed-training runtime.

    import minipar
    minipar.init()                          # MPI under mpiexec, torch under torchrun
    minipar.all_reduce(x, algorithm="ring")
    with minipar.trace() as t: ...

`import minipar` is light (no torch, no MPI, no numpy): each name below is loaded on first use.
"""

from __future__ import annotations

from minipar import lazy

__version__ = "0.1.0"

_LAZY = {
    # runtime
    "init": "minipar.runtime",
    "finalize": "minipar.runtime",
    "is_initialized": "minipar.runtime",
    "get_rank": "minipar.runtime",
    "get_world_size": "minipar.runtime",
    "get_backend": "minipar.runtime",
    "new_group": "minipar.runtime",
    "device": "minipar.devices",
    "local_rank": "minipar.devices",
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
    "get_group_rank": "minipar.runtime",
    "get_global_rank": "minipar.runtime",
    "get_process_group_ranks": "minipar.runtime",
    "group": "minipar.runtime",
    "GroupMember": "minipar.runtime",
    "init_process_group": "minipar.process_group",
    "destroy_process_group": "minipar.process_group",
    "is_available": "minipar.process_group",
    # the rest
    "ReduceOp": "minipar.ops",
    "trace": "minipar.ledger",
    "MiniparError": "minipar.errors",
    "CommTimeoutError": "minipar.errors",
    "MessageSizeError": "minipar.errors",
    "MismatchError": "minipar.errors",
    "NotInitializedError": "minipar.errors",
    # launching from a Python session or notebook; the MPI set-up diagnosed
    "launch": "minipar.notebook",
    "RankError": "minipar.errors",
    "MPISetupError": "minipar.errors",
}
_SUBMODULES = {
    "cost",
    "comm",
    "collectives",
    "buffers",
    "ops",
    "errors",
    "runtime",
    "parallel",
    "ledger",
}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)


__getattr__, __dir__ = lazy.attributes(__name__, _LAZY, _SUBMODULES)
