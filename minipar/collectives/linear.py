"""Linear algorithms: the root talks to every other rank, one after the other.

This is what a student writes first, and the baseline every other algorithm is measured against:
p - 1 steps, and all the traffic crosses the root's one link. Each function numbers its steps by
peer (the message with the k-th other rank is step k), which is how the root's link serialises
them, even though the sends are all posted at once.

The reductions here combine in rank order, x0 op x1 op ... op x(p-1), so on every dtype the result
equals a sequential left-to-right reduction on one process, bit for bit.
"""

from __future__ import annotations

from minipar.collectives import layout
from minipar.collectives.reduce_op import reduce_
from minipar.comm.transport import buffers


def _others(call, rank: int):
    """(step, peer) for each rank but `rank`, in rank order; steps continue the call's count."""
    peers = [q for q in range(call.size) if q != rank]
    return [(call.step + k, q) for k, q in enumerate(peers)]


def _step_of(call, rank: int, root: int) -> int:
    """The step in which `rank` exchanges with the root."""
    return call.step + (rank if rank < root else rank - 1)


def _then(call, first: int) -> None:
    """Start a second phase after the first phase's p - 1 steps (ranks left it unevenly)."""
    call.step = first + call.size - 1


def broadcast_linear(call, x, root: int) -> None:
    """The root sends all n bytes to each of the p-1 others: (p-1) n bytes, p-1 steps."""
    # BEGIN ANSWER ex02_broadcast_linear
    if call.rank == root:
        requests = []
        for step, q in _others(call, root):
            call.step = step
            requests.append(call.isend(x, q))
        call.wait(requests)
    else:
        call.step = _step_of(call, call.rank, root)
        call.recv(x, root)
    # END ANSWER


def reduce_linear(call, x, root: int, op) -> None:
    """Everyone sends n bytes to the root, which reduces in rank order: p-1 steps; the root
    receives (p-1) n bytes and needs one n-element scratch buffer."""
    if call.rank != root:
        call.step = _step_of(call, call.rank, root)
        call.send(x, root)
        return
    incoming = [buffers.empty(x, len(x)) for _ in range(call.size - 1)]
    requests = []
    for i, (step, q) in enumerate(_others(call, root)):
        call.step = step
        requests.append(call.irecv(incoming[i], q))
    call.wait(requests)
    if root == 0:
        for part in incoming:
            reduce_(x, part, op)
        return
    total = incoming[0]  # x0, then op with x1, ..., inserting the root's own x at its place
    parts = incoming[1:root] + [x] + incoming[root:]
    for part in parts:
        reduce_(total, part, op)
    buffers.copy_(x, total)


def all_reduce_linear(call, x, op) -> None:
    """Linear reduce to rank 0, then linear broadcast: 2 (p-1) steps, rank 0 moves 2 (p-1) n
    bytes. Bitwise a left-to-right sum, identical on every rank."""
    first = call.step
    reduce_linear(call, x, 0, op)
    _then(call, first)
    broadcast_linear(call, x, 0)


def scatter_linear(call, out, inp, root: int) -> None:
    """The root sends block q to rank q: (p-1) n bytes from the root in p-1 steps."""
    n = len(out)
    if call.rank != root:
        call.step = _step_of(call, call.rank, root)
        call.recv(out, root)
        return
    requests = []
    for step, q in _others(call, root):
        call.step = step
        requests.append(call.isend(inp[q * n : (q + 1) * n], q))
    buffers.copy_(out, inp[root * n : (root + 1) * n])
    call.wait(requests)


def gather_linear(call, out, inp, root: int) -> None:
    """Every rank sends its block to the root: (p-1) n bytes into the root in p-1 steps."""
    n = len(inp)
    if call.rank != root:
        call.step = _step_of(call, call.rank, root)
        call.send(inp, root)
        return
    requests = []
    for step, q in _others(call, root):
        call.step = step
        requests.append(call.irecv(out[q * n : (q + 1) * n], q))
    buffers.copy_(out[root * n : (root + 1) * n], inp)
    call.wait(requests)


def all_gather_linear(call, out, inp) -> None:
    """Gather to rank 0, then rank 0 broadcasts all p n elements to each rank: 2 (p-1) steps,
    rank 0 sends (p-1) p n bytes. Simple, and exactly why rings exist."""
    first = call.step
    gather_linear(call, out, inp, 0)
    _then(call, first)
    broadcast_linear(call, out, 0)


def reduce_scatter_linear(call, out, inp, op) -> None:
    """Reduce all p n elements to rank 0, then scatter the blocks: 2 (p-1) steps. The
    reduction is in rank order, so each block equals a left-to-right reduction bitwise."""
    total = buffers.empty(inp, len(inp))
    buffers.copy_(total, inp)
    first = call.step
    reduce_linear(call, total, 0, op)
    _then(call, first)
    scatter_linear(call, out, total, 0)


def all_to_all_linear(call, out, inp, out_edges=None, in_edges=None) -> None:
    """Every rank posts all its sends and receives at once (MPI's basic linear all-to-all):
    (p-1) n bytes out and in per rank, p-1 steps numbered by peer distance.

    Blocks may differ in size (all_to_all's lists, all_to_all_single's split sizes): then block
    q of inp is inp[in_edges[q]:in_edges[q + 1]] and block q of out likewise with out_edges;
    a rank sends the sum of its blocks but its own."""
    p, r = call.size, call.rank
    oe, ie = out_edges or layout.bounds(len(out), p), in_edges or layout.bounds(len(inp), p)
    requests = []
    for k in range(1, p):
        call.step = k - 1
        dst, src = (r + k) % p, (r - k) % p
        requests.append(call.irecv(layout.chunk(out, oe, src), src))
        requests.append(call.isend(layout.chunk(inp, ie, dst), dst))
    buffers.copy_(layout.chunk(out, oe, r), layout.chunk(inp, ie, r))
    call.wait(requests)
