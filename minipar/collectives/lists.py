"""The list forms of torch.distributed's collectives: all_to_all and reduce_scatter on lists of
tensors, on minipar's algorithms.

    minipar.all_to_all(outputs, inputs)        # inputs[j] goes to rank j, outputs[i] comes from i
    minipar.reduce_scatter(output, inputs)     # output = inputs[rank] reduced over the group

Each packs the list into one flat buffer (a copy of the inputs), runs the tensor collective on
it (all_to_all_single's algorithms, reduce_scatter_tensor's), and copies the result out into the
list, so it moves exactly the bytes of the tensor form, plus one local copy in and one out.
all_to_all's tensors may differ in size (an all-to-all-v): ranks must agree on what i sends j.
"""

from __future__ import annotations

from minipar import runtime
from minipar.collectives.api import check_list, equal_or, reduce_scatter_tensor, run_call, same_type
from minipar.collectives.reduce_op import ReduceOp, as_op, check_op
from minipar.comm.transport import buffers


def _tensors(tensors, comm, what: str, writable: bool = False) -> None:
    if not isinstance(tensors, (list, tuple)) or len(tensors) != comm.size:
        got = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
        raise ValueError(
            f"{what} must be a list of {comm.size} tensors (the group size), got {got}"
        )
    for i, t in enumerate(tensors):
        buffers.check(t, f"{what}[{i}]", writable=writable)


def _packed(tensors):
    """(one new flat buffer holding the tensors one after the other, their p + 1 offsets)."""
    edges = [0]
    for t in tensors:
        edges.append(edges[-1] + buffers.numel(t))
    flat = buffers.empty(buffers.flat(tensors[0]), edges[-1])
    for i, t in enumerate(tensors):
        buffers.copy_(flat[edges[i] : edges[i + 1]], buffers.flat(t))
    return flat, edges


def all_to_all(output_tensor_list, input_tensor_list, group=None, algorithm="auto", async_op=False):
    """input_tensor_list[j] of rank i lands in output_tensor_list[i] of rank j; sizes may differ.

    Moves: what all_to_all_single moves for the same blocks (each rank sends the sum of its
    inputs but its own, in p - 1 steps)."""
    if group is not None and runtime.outside(group, "all_to_all"):
        return None
    comm = runtime.resolve(group)
    _tensors(output_tensor_list, comm, "output_tensor_list", writable=True)
    _tensors(input_tensor_list, comm, "input_tensor_list")
    like = input_tensor_list[0]
    for what, tensors in (
        ("input_tensor_list", input_tensor_list),
        ("output_tensor_list", output_tensor_list),
    ):
        for i, t in enumerate(tensors):
            same_type(t, like, f"{what}[{i}]", "input_tensor_list[0]")
    inp, in_edges = _packed(input_tensor_list)
    out_edges = [0]
    for t in output_tensor_list:
        out_edges.append(out_edges[-1] + buffers.numel(t))
    out = buffers.empty(inp, out_edges[-1])

    def unpack():
        for i, t in enumerate(output_tensor_list):
            buffers.copy_(buffers.flat(t), out[out_edges[i] : out_edges[i + 1]])

    return run_call(
        comm,
        "all_to_all",
        algorithm,
        buffers.nbytes(inp),
        (out, inp, *equal_or(out_edges, in_edges, comm.size)),
        async_op,
        finish=unpack,
        fingerprint=(like, None, None, None),
        uneven=True,
    )


def reduce_scatter(
    output, input_list, op=ReduceOp.SUM, group=None, algorithm="auto", async_op=False
):
    """Reduce input_list (group-size tensors, each of output's shape) over the group; rank r gets
    the reduction of everyone's input_list[r] in `output`.

    Moves: what reduce_scatter_tensor moves for p blocks of numel(output) elements."""
    if group is not None and runtime.outside(group, "reduce_scatter"):
        return None
    comm = runtime.resolve(group)
    op = as_op(op)
    buffers.check(output, "output", writable=True)
    check_list(input_list, output, comm, "input_list", like_what="output")
    check_op(op, output)
    inp, _ = _packed(input_list)  # the list, laid end to end, is reduce_scatter_tensor's input
    return reduce_scatter_tensor(output, inp, op, group, algorithm, async_op)
