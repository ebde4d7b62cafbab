"""Recursive doubling and halving: in step k rank r pairs with r XOR 2^k (a butterfly).

    p = 8, all-reduce by recursive doubling     step 0: 0<>1 2<>3 4<>5 6<>7
                                                step 1: 0<>2 1<>3 4<>6 5<>7
                                                step 2: 0<>4 1<>5 2<>6 3<>7

After step k each rank holds the result over a group of 2^(k+1) ranks, so log2 p steps suffice.
Doubling exchanges the whole buffer every step (latency-optimal, for small messages); halving
exchanges half of what is left (bandwidth-optimal; Rabenseifner's all-reduce pairs a halving
reduce-scatter with a doubling all-gather). References: Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH" (2005).

Any p, as MPICH does: with p2 the largest power of two <= p and rem = p - p2, the first 2 rem
ranks pair up (even hands its data to odd and sits out), the p2 left run the butterfly, and the
odd ones hand the result back: two extra steps (layout.fold).
"""

from __future__ import annotations

from minipar.collectives import layout, workspace
from minipar.collectives.reduce_op import reduce_
from minipar.comm.transport import buffers


def _fold_in(call, x, op, rem: int) -> int | None:
    """Step 0 of a folded run: even ranks below 2 rem send all of x to rank + 1, which reduces.
    Returns this rank's participant number, or None if it sits out."""
    me = layout.folded_rank(call.rank, rem)
    if rem:
        for _ in call.rounds(1):
            if call.rank < 2 * rem and me is None:
                call.send(x, call.rank + 1)
            elif call.rank < 2 * rem:
                incoming = buffers.empty(x, len(x))
                call.recv(incoming, call.rank - 1)
                reduce_(x, incoming, op)
    return me


def _fold_out(call, x, rem: int, me) -> None:
    """Last step of a folded run: odd ranks below 2 rem send the finished x back to rank - 1."""
    if rem:
        for _ in call.rounds(1):
            if call.rank < 2 * rem and me is None:
                call.recv(x, call.rank + 1)
            elif call.rank < 2 * rem:
                call.send(x, call.rank - 1)


def all_reduce_recursive_doubling(call, x, op) -> None:
    """Exchange the whole buffer with r XOR 2^k and reduce, for k = 0 .. log2 p - 1.

    p a power of two: log2 p steps, n log2 p bytes sent per rank. Otherwise log2 p2 + 2 steps
    and one more n-byte message on the folded ranks. Both partners compute (lower rank's data) op
    (higher rank's data), so every rank ends bitwise identical, even for MIN of -0.0 and +0.0;
    it is not a left-to-right sum (the association is a balanced tree).
    """
    # BEGIN ANSWER ex03_recursive_doubling
    p2, rem = layout.fold(call.size)
    me = _fold_in(call, x, op, rem)
    if me is not None:
        incoming = workspace.empty(x, len(x))
        for k in call.rounds(p2.bit_length() - 1):
            partner = layout.unfolded_rank(me ^ (1 << k), rem)
            call.sendrecv(x, partner, incoming, partner)
            reduce_(x, incoming, op, reverse=partner < call.rank)  # both compute low op high
    _fold_out(call, x, rem, me)
    # END ANSWER


def _halving(call, x, edges, me: int, p2: int, rem: int, span, op, scratch) -> None:
    """Recursive halving among the p2 participants (me is this rank's participant number).

    In step k the pairs p2 / 2^(k+1) apart split the participants they still share in two halves;
    each keeps the half it is in, sends the other half's chunks and reduces the ones it keeps.
    `span(a, b)` gives the chunk range [first, last) of participants [a, b); x is cut by edges.
    """
    lo, hi = 0, p2
    for _ in call.rounds(p2.bit_length() - 1):
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if me < mid else ((mid, hi), (lo, mid))
        a, b = span(*keep)
        c, d = span(*give)
        mine = x[edges[a] : edges[b]]
        peer = layout.unfolded_rank(me ^ (mid - lo), rem)
        incoming = scratch[: len(mine)]
        call.sendrecv(x[edges[c] : edges[d]], peer, incoming, peer)
        reduce_(mine, incoming, op)
        lo, hi = keep


def _doubling_gather(call, x, edges, me: int, p2: int, rem: int, span) -> None:
    """Recursive doubling all-gather among participants: in step k exchange the chunks of the
    aligned group of 2^k participants this one belongs to with the partner group's."""
    for k in call.rounds(p2.bit_length() - 1):
        size = 1 << k
        mine, theirs = me & ~(size - 1), (me ^ size) & ~(size - 1)
        a, b = span(mine, mine + size)
        c, d = span(theirs, theirs + size)
        peer = layout.unfolded_rank(me ^ size, rem)
        call.sendrecv(x[edges[a] : edges[b]], peer, x[edges[c] : edges[d]], peer)


def _covered_span(rem: int):
    """span() for chunks indexed by original rank: participant j stands for layout.covered(j)."""
    return lambda a, b: (layout.covered(a, rem)[0], layout.covered(b - 1, rem)[1])


def all_gather_recursive_doubling(call, out, inp) -> None:
    """Recursive doubling all-gather: in step k exchange everything gathered so far (2^k blocks).

    p a power of two: log2 p steps, (p-1) n bytes sent per rank (n = one block). Otherwise the
    folded pairs first merge their blocks (one step), and the result goes back (one step).
    """
    p, n = call.size, len(inp)
    p2, rem = layout.fold(p)
    edges = [c * n for c in range(p + 1)]
    buffers.copy_(out[call.rank * n : (call.rank + 1) * n], inp)
    me = layout.folded_rank(call.rank, rem)
    if rem:
        for _ in call.rounds(1):
            if call.rank < 2 * rem and me is None:
                call.send(inp, call.rank + 1)
            elif call.rank < 2 * rem:
                call.recv(out[(call.rank - 1) * n : call.rank * n], call.rank - 1)
    if me is not None:
        _doubling_gather(call, out, edges, me, p2, rem, _covered_span(rem))
    _fold_out(call, out, rem, me)


def reduce_scatter_recursive_halving(call, out, inp, op) -> None:
    """Recursive halving reduce-scatter: step k exchanges and reduces half of what is left.

    p a power of two: log2 p steps, (p-1) n bytes sent per rank (n = one output block), the
    first message carrying half the buffer. Otherwise the folded pairs first reduce whole
    buffers (one step), and each odd rank finally sends its even partner its block (one step).
    Works on a copy of inp (p n elements), which stays as the caller gave it.
    """
    p, n = call.size, len(out)
    p2, rem = layout.fold(p)
    edges = [c * n for c in range(p + 1)]
    work = buffers.empty(inp, len(inp))
    buffers.copy_(work, inp)
    me = _fold_in(call, work, op, rem)
    if me is not None:
        scratch = buffers.empty(inp, len(inp))
        _halving(call, work, edges, me, p2, rem, _covered_span(rem), op, scratch)
    if rem:
        for _ in call.rounds(1):
            if call.rank < 2 * rem and me is None:
                call.recv(out, call.rank + 1)
            elif call.rank < 2 * rem:
                call.send(work[(call.rank - 1) * n : call.rank * n], call.rank - 1)
    if me is not None:
        buffers.copy_(out, work[call.rank * n : (call.rank + 1) * n])


def all_reduce_rabenseifner(call, x, op) -> None:
    """Rabenseifner: recursive halving reduce-scatter, then recursive doubling all-gather, over
    p2 chunks of x.

    p a power of two: 2 log2 p steps and 2 (p-1)/p n bytes per rank, like the ring in bytes but
    with log p steps instead of p. Otherwise the fold adds two steps and one n-byte message on
    the folded ranks. Each chunk is reduced on one rank then copied: identical on every rank.
    Extra memory: n/2 elements.
    """
    p2, rem = layout.fold(call.size)
    me = _fold_in(call, x, op, rem)
    if me is not None:
        edges = layout.bounds(len(x), p2)  # chunk j ends up owned by participant j
        span = lambda a, b: (a, b)  # noqa: E731
        scratch = workspace.empty(x, edges[p2 // 2])  # the largest half (extras go first)
        _halving(call, x, edges, me, p2, rem, span, op, scratch)
        _doubling_gather(call, x, edges, me, p2, rem, span)
    _fold_out(call, x, rem, me)
