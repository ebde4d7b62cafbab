"""The two-level all-reduce, pipelined: chunk c crosses between nodes while chunk c+1 is reduced
inside the node and chunk c-1 is gathered (Open MPI's coll/han and NCCL pipeline the same way).

hierarchical.py runs its three phases one after the other, so the slow link idles through the
reduce-scatter and the all-gather inside the node. Here the buffer is cut into C pieces and the
phases become the stages of a pipeline, one tick at a time:

    tick t:   reduce-scatter inside piece t  |  all-reduce across piece t-1  |  all-gather inside
              (k-1 steps)                    |  (2 (N-1) steps, the link)    |  piece t-2 (k-1)

Each tick runs max(2 (k-1), 2 (N-1)) steps: in each, this rank posts every message of the
stages that have one at that step (isend/irecv), then waits, then reduces; the message across
is on the wire while the inside step's bytes arrive and are reduced (the inside requests are
waited on first). C + 2 ticks in all.

Bitwise the same result as hierarchical.py, for any N and k: a piece is not a slice of the
buffer but the c-th slice of every block (j, d), where j is the chunk local rank j owns inside
the node and d the sub-chunk across-rank d owns of it (the same bounds hierarchical.py cuts).
Each element is then reduced by the same ring, in the same order, as there; only the rounds
differ. The price: inside, one message per sub-chunk (N per step instead of 1).

Bytes per rank are hierarchical.py's exactly (every block is split among the pieces, none
twice): 2 (k-1)/k S inside the node, 2 (N-1)/N S/k between nodes. Steps: (C+1) R + 2 (k-1)
with R = max(2 (k-1), 2 (N-1)) (the last tick only gathers); messages inside: N a step.
C comes from minipar.cost.pipeline_chunks (at most the smallest block's length, so no piece
is empty). On one node, or nodes of unequal size: the flat ring, as hierarchical.py; on nodes
of one rank, its ring across.
"""

from __future__ import annotations

from minipar import cost
from minipar.collectives import hierarchical, layout, ring, workspace
from minipar.collectives.reduce_op import reduce_
from minipar.comm.transport import buffers


class _Stage:
    """One ring phase of one piece: `chunks[c]` the views chunk c of the ring is made of;
    `op` None for an all-gather. step(s) posts step s's messages; finish(s) reduces."""

    def __init__(self, level, chunks, op, scratch=None):
        self.level, self.chunks, self.op, self.scratch = level, chunks, op, scratch
        self.pending = []

    def post(self, s: int) -> list:
        lv, p = self.level, self.level.size
        r, right, left = lv.rank, (lv.rank + 1) % p, (lv.rank - 1) % p
        gather = self.op is None
        send_c = (r - s) % p if gather else (r - s - 1) % p
        recv_c = (send_c - 1) % p
        requests, at = [], 0
        for view in self.chunks[recv_c]:
            into = view if gather else self.scratch[at : at + len(view)]
            at += len(view)
            requests.append(lv.irecv(into, left))
            self.pending.append((view, into))
        requests += [lv.isend(view, right) for view in self.chunks[send_c]]
        return requests

    def finish(self) -> None:
        if self.op is not None:
            for mine, got in self.pending:
                reduce_(mine, got, self.op)  # the argument order ring.py uses
        self.pending = []


def _pieces(x, inside_rank: int, k: int, N: int, C: int):
    """For each piece c: (inside chunks, across chunks), each a list of lists of views."""
    edges = layout.bounds(len(x), k)
    blocks = []  # blocks[j][d]: sub-chunk d of inside chunk j
    for j in range(k):
        part = layout.chunk(x, edges, j)
        sub = layout.bounds(len(part), N)
        blocks.append([layout.chunk(part, sub, d) for d in range(N)])
    pieces = []
    for c in range(C):
        cut = [[layout.chunk(b, layout.bounds(len(b), C), c) for b in row] for row in blocks]
        pieces.append((cut, [[view] for view in cut[inside_rank]]))
    return pieces


def all_reduce_hierarchical_pipelined(call, x, op) -> None:
    """Two-level all-reduce in C pieces through a three-stage pipeline (the module docstring)."""
    by_node = hierarchical.members(call.comm)
    two = hierarchical.levels(call, by_node) if len(by_node) > 1 else None
    if two is None:
        return ring.all_reduce_ring(call, x, op)
    inside, across = two
    k, N = inside.size, across.size
    if k == 1:  # nothing inside to hide behind the link: hierarchical's ring across
        return ring.all_reduce_ring(across, x, op)
    smallest = len(x) // (k * N)
    C = max(1, min(cost.pipeline_chunks(buffers.nbytes(x), N, k), smallest))
    pieces = _pieces(x, inside.rank, k, N, C)
    width = -(-len(x) // k) + N  # one inside chunk of a piece, at most
    scratch_in = workspace.empty(x, width, 2)
    scratch_across = workspace.empty(x, width, 3)
    R = max(2 * (k - 1), 2 * (N - 1))
    for t in range(C + 2):
        for i in range(R):
            call.step = t * R + i
            now = _now(t, i, C, k, N, pieces, inside, across, op, scratch_in, scratch_across)
            posted = [(stage, stage.post(s)) for stage, s in now]
            for stage, requests in posted:  # inside first: reduced while the link still sends
                call.wait(requests)
                stage.finish()
    call.step = (C + 2) * R


def _now(t, i, C, k, N, pieces, inside, across, op, scratch_in, scratch_across):
    """(stage, its step) of every stage with a message at step i of tick t, inside ones first."""
    now = []
    if t < C and i < k - 1:  # reduce-scatter inside, piece t
        now.append((_Stage(inside, pieces[t][0], op, scratch_in), i))
    if 0 <= t - 2 < C and k - 1 <= i < 2 * (k - 1):  # all-gather inside, piece t-2
        now.append((_Stage(inside, pieces[t - 2][0], None), i - (k - 1)))
    if 0 <= t - 1 < C and i < 2 * (N - 1):  # all-reduce across, piece t-1
        gather = i >= N - 1
        stage = _Stage(across, pieces[t - 1][1], None if gather else op, scratch_across)
        now.append((stage, i - (N - 1) if gather else i))
    return now
