"""Starting and stopping minipar, and the groups, ranks and devices of this process's world.

    minipar.init()                        world.py: the default group, timeouts, debug, fast paths
    minipar.new_group([0, 1])             world.py: sub-groups, ranks in and out of them
    minipar.device()                      devices.py: this rank's GPU (or the CPU)
    minipar.node_rank(), num_nodes()      nodes.py: which node each rank runs on
    dist.init_process_group("mpi")        process_group.py: torch.distributed's own spelling

What they find and start is kept in one object, `minipar.state.process`; `finalize()` empties it.
"""

from minipar.runtime.devices import device, local_rank
from minipar.runtime.nodes import local_world_size, node_groups, node_map, node_rank, num_nodes
from minipar.runtime.process_group import destroy_process_group, init_process_group, is_available
from minipar.runtime.world import (
    GroupMember,
    debug_enabled,
    default_group,
    detect_backend,
    exit_inside_collective,
    finalize,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init,
    is_initialized,
    new_group,
    outside,
    resolve,
)

__all__ = [
    "GroupMember",
    "debug_enabled",
    "default_group",
    "destroy_process_group",
    "detect_backend",
    "device",
    "exit_inside_collective",
    "finalize",
    "get_backend",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init",
    "init_process_group",
    "is_available",
    "is_initialized",
    "local_rank",
    "local_world_size",
    "node_groups",
    "node_map",
    "node_rank",
    "num_nodes",
    "new_group",
    "outside",
    "resolve",
]
