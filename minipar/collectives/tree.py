"""Binomial trees: the set of ranks that hold the data doubles (or halves) every step.

Ranks are renumbered relative to the root, vr = (rank - root) mod p, so any root works the same.

    broadcast, p = 8          step 0: 0->1      step 1: 0->2, 1->3     step 2: 0->4 1->5 2->6 3->7

After step k, ranks vr < 2^(k+1) have the data, so everyone has it after ceil(log2 p) steps,
against p - 1 for the linear root-sends-to-all. Each message carries the whole buffer, so trees
win for small messages (latency-bound) and lose to rings for large ones (bandwidth-bound).
"""

from __future__ import annotations

from minipar.collectives.reduce_op import reduce_
from minipar.comm.transport import buffers


def _depth(p: int) -> int:
    """ceil(log2 p): the number of steps of a binomial tree over p ranks."""
    return (p - 1).bit_length()


def broadcast_tree(call, x, root: int) -> None:
    """Binomial broadcast: ceil(log2 p) steps; the root sends n bytes in each step, every other
    rank receives n bytes once and forwards at most ceil(log2 p) - 1 times."""
    # BEGIN ANSWER ex02_broadcast_binomial broadcast_binomial
    p = call.size
    vr = (call.rank - root) % p
    for k in call.rounds(_depth(p)):
        mask = 1 << k
        if vr < mask and vr + mask < p:
            call.send(x, (call.rank + mask) % p)
        elif mask <= vr < 2 * mask:
            call.recv(x, (call.rank - mask) % p)
    # END ANSWER


def reduce_tree(call, x, root: int, op) -> None:
    """Binomial reduce, the broadcast run backwards: in step k ranks with bit k set send their
    partial result to vr - 2^k and drop out. ceil(log2 p) steps, n bytes per message; the root
    receives n bytes per step. x is the reduction on the root; elsewhere it is left untouched."""
    p = call.size
    vr = (call.rank - root) % p
    acc, incoming = x, None
    for k in call.rounds(_depth(p)):
        mask = 1 << k
        if vr % mask:
            continue  # sent its part in an earlier step
        if vr & mask:
            call.send(acc, (call.rank - mask) % p)
        elif vr + mask < p:
            if acc is x and vr != 0:
                acc = buffers.empty(x, len(x))  # keep x as the caller gave it
                buffers.copy_(acc, x)
            incoming = incoming if incoming is not None else buffers.empty(x, len(x))
            call.recv(incoming, (call.rank + mask) % p)
            reduce_(acc, incoming, op)


def all_reduce_tree(call, x, op) -> None:
    """Binomial reduce to rank 0, then binomial broadcast: 2 ceil(log2 p) steps, n bytes per
    message. The result is computed once and copied, so all ranks are bitwise identical."""
    reduce_tree(call, x, 0, op)
    broadcast_tree(call, x, 0)


def scatter_tree(call, out, inp, root: int) -> None:
    """Binomial scatter: the root hands half of the blocks it still holds to a new rank each step.

    ceil(log2 p) steps; the root sends (p-1) * n bytes in all (n = one block), the first message
    carrying about half the data. Intermediate ranks keep their subtree's blocks in scratch.
    """
    p, n = call.size, len(out)
    vr = (call.rank - root) % p
    held = _rotated(inp, root, p, n) if vr == 0 else None  # held[i] = block of vr + i
    depth = _depth(p)
    for j in call.rounds(depth):
        mask = 1 << (depth - 1 - j)
        if held is not None and vr % (2 * mask) == 0 and vr + mask < p:
            count = min(mask, p - vr - mask)
            call.send(held[mask * n : (mask + count) * n], (call.rank + mask) % p)
        elif vr % (2 * mask) == mask:
            count = min(mask, p - vr)
            held = out if count == 1 else buffers.empty(out, count * n)
            call.recv(held, (call.rank - mask) % p)
    if held is not out:
        buffers.copy_(out, held[:n])


def gather_tree(call, out, inp, root: int) -> None:
    """Binomial gather, the scatter run backwards: ceil(log2 p) steps; the root receives
    (p-1) * n bytes in all, the last message carrying about half of them."""
    p, n = call.size, len(inp)
    vr = (call.rank - root) % p
    span = p if vr == 0 else min(vr & -vr, p - vr)  # how many blocks this subtree collects
    held = inp if span == 1 else buffers.empty(inp, span * n)
    if span > 1:
        buffers.copy_(held[:n], inp)
    for k in call.rounds(_depth(p)):
        mask = 1 << k
        if vr % mask:
            continue
        if vr & mask:
            call.send(held, (call.rank - mask) % p)
        elif vr + mask < p:
            count = min(mask, p - vr - mask)
            call.recv(held[mask * n : (mask + count) * n], (call.rank + mask) % p)
    if vr == 0:
        _unrotate(out, held, root, p, n)


def _rotated(blocks, root: int, p: int, n: int):
    """The root's blocks in relative order (block of rank root first); a view when root is 0."""
    if root == 0:
        return blocks
    rotated = buffers.empty(blocks, p * n)
    buffers.copy_(rotated[: (p - root) * n], blocks[root * n :])
    buffers.copy_(rotated[(p - root) * n :], blocks[: root * n])
    return rotated


def _unrotate(out, held, root: int, p: int, n: int) -> None:
    buffers.copy_(out[root * n :], held[: (p - root) * n])
    buffers.copy_(out[: root * n], held[(p - root) * n :])
