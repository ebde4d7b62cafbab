"""Hand-written collectives on the transport's point-to-point messages.

    from minipar.collectives import all_reduce, all_gather_into_tensor, isend, irecv
    all_reduce(x, group=tp_group)          # what `minipar.all_reduce` is

The algorithms, one file per family, where a student looks for them: ring.py, tree.py (binomial),
recursive.py (doubling and halving, Rabenseifner), linear.py, bruck.py, pairwise.py,
double_tree.py, hierarchical.py (two levels: inside a node, then across nodes), pipelined.py
(the two-level all-reduce in pieces through both levels at once), barrier.py;
layout.py and workspace.py the chunk arithmetic and scratch buffers they share; reduce_op.py what
`op=` means. api.py is the public, torch.distributed-like surface (check the arguments, pick the
algorithm, run it), registry.py the table of algorithms and `auto`'s choice, call.py one call in
flight, work.py async calls; p2p.py, objects.py and lists.py torch.distributed's point-to-point,
object and list forms; window_buffer.py hands out buffers that live in the node's shared window
(`empty`). fast/ holds the shortcuts that give the
same results sooner (a student can read past it).
"""

from minipar.collectives.api import (
    algorithms,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter_tensor,
    register_algorithm,
    scatter,
)
from minipar.collectives.lists import all_to_all, reduce_scatter
from minipar.collectives.objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    scatter_object_list,
)
from minipar.collectives.p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from minipar.collectives.reduce_op import ReduceOp
from minipar.collectives.window_buffer import empty, in_window
from minipar.collectives.work import Work

__all__ = [
    "P2POp",
    "ReduceOp",
    "Work",
    "algorithms",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "empty",
    "gather",
    "gather_object",
    "in_window",
    "irecv",
    "isend",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "register_algorithm",
    "scatter",
    "scatter_object_list",
    "send",
]
