"""Ring attention: every rank keeps its queries, the keys and values travel around the ring.

    out = ring_attention(q, k, v, group=cp_group, causal=True)   # q, k, v: this rank's shard

Each of the cp ranks holds a shard of the sequence (shard_sequence cuts it): q, k, v shaped
(batch, heads, local_seq, head_dim). In step s rank r computes its queries against the K/V
block of rank r - s, merges the partial result into its running (out, lse) with the online
softmax (online_softmax.py), and passes the block on to rank r + 1: the ring of lesson 03,
carrying K/V instead of gradient chunks (Liu et al. 2023, "Ring Attention").

    step 0          step 1          step 2          step 3            cp = 4: rank r holds
    r0: KV0         r0: KV3         r0: KV2         r0: KV1           KV_r at step 0 and
    r1: KV1   ->    r1: KV0   ->    r1: KV3   ->    r1: KV2           KV_(r-s) at step s
    r2: KV2         r2: KV1         r2: KV0         r2: KV3
    r3: KV3         r3: KV2         r3: KV1         r3: KV0

The next block's receive (and this block's send) is posted before this block's compute, so the
message travels while the rank computes; only what compute did not hide shows as waiting.

Bytes per rank (B = one K/V block = 2 x batch x heads x local_seq x head_dim x itemsize):
    forward   cp - 1 steps, (cp - 1) B sent: every block but the last is passed on
    backward  the K/V again, (cp - 1) B, and the partial dK/dV of each block, which follow it
              round the ring and land on its owner: (cp - 1) B more (in float32 for half
              precision inputs), so backward sends twice the forward's bytes
Memory per rank: the saved q, k, v, out (batch, heads, local_seq, head_dim each) and lse
(batch, heads, local_seq): 1/cp of dense attention's, plus one K/V block in flight.

Causal: with the load-balanced layout (rank r holds chunks r and 2cp-1-r of 2cp chunks of
c tokens; layout.py) every step does the same work on every rank:
    step 0        own K/V: the local 2c x 2c block with a causal mask (its tokens are in order)
    src < rank    all 2c queries against the source's head chunk (c keys): its tail is later
    src > rank    the tail's c queries against all 2c keys: the head's queries are all earlier
so each rank does 1 + (cp - 1) block products, 4c^2 + 2(cp - 1)c^2 scores. With the contiguous
split (balanced=False, shards from shard_sequence(..., causal=False)) rank r skips the cp - 1 - r
blocks later than its own and does r + 1 products: rank cp - 1 works cp times as long as rank 0.
"""

from __future__ import annotations

import torch

from minipar import collectives, runtime
from minipar.parallel.context import checks, online_softmax
from minipar.parallel.context.stats import timed

KV_TAG, DKV_TAG = 2401, 2402  # point-to-point tags: K/V blocks, travelling dK/dV


def block_of(step: int, rank: int, cp: int, local_seq: int, causal: bool, balanced: bool):
    """(query rows, key rows, causal mask?) of rank's block product at ring step `step` (keys of
    rank (rank - step) % cp), or None when the causal mask hides the whole block."""
    src, every = (rank - step) % cp, slice(0, local_seq)
    if not causal:
        return every, every, False
    if src == rank:
        return every, every, True
    if not balanced:
        return (every, every, False) if src < rank else None
    half = local_seq // 2
    if src < rank:
        return every, slice(0, half), False
    return slice(half, local_seq), every, False


def _neighbours(group) -> tuple[int, int]:
    cp, rank = runtime.get_world_size(group), runtime.get_rank(group)
    return (rank + 1) % cp, (rank - 1) % cp


def pass_on(block, incoming, group, tag: int) -> list:
    """Post the receive of the left neighbour's block into `incoming` and the send of `block` to
    the right neighbour; returns their Works."""
    right, left = _neighbours(group)
    return collectives.batch_isend_irecv(
        [
            collectives.P2POp(collectives.irecv, incoming, group=group, group_peer=left, tag=tag),
            collectives.P2POp(collectives.isend, block, group=group, group_peer=right, tag=tag),
        ]
    )


def _wait(works, stats) -> None:
    with timed(stats, "wait_seconds"):
        for work in works:
            work.wait()


def ring_forward(q, k, v, group, causal, balanced, stats):
    """(out, lse) of this rank's queries over every rank's keys, in the accumulation dtype."""
    cp, rank = runtime.get_world_size(group), runtime.get_rank(group)
    kv = torch.stack([k, v])  # one message per step: this block's keys and values
    out = lse = None
    for step in range(cp):
        works, incoming = [], None
        if step < cp - 1:  # the next block is on its way while this one is computed
            incoming = torch.empty_like(kv)
            works = pass_on(kv, incoming, group, KV_TAG)
        block = block_of(step, rank, cp, q.shape[2], causal, balanced)
        if block is not None:
            rows, cols, diagonal = block
            qb, kb, vb = q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols]
            with timed(stats, "compute_seconds"):
                o, m = online_softmax.block_attention(qb, kb, vb, causal=diagonal)
                if out is None:  # step 0: every query row, its own keys
                    out, lse = o, m
                else:
                    out[:, :, rows], lse[:, :, rows] = online_softmax.merge(
                        out[:, :, rows], lse[:, :, rows], o, m
                    )
            if stats is not None:
                stats.add_block("forward", qb.shape, kb.shape)
        _wait(works, stats)
        kv = incoming
    return out, lse


def ring_backward(dout, q, k, v, out, lse, group, causal, balanced, stats):
    """(dq, dk, dv) of this rank's shard. K/V go round the ring again; each block's partial
    dK/dV follows one step behind it and arrives at its owner after the last step."""
    cp, rank = runtime.get_world_size(group), runtime.get_rank(group)
    acc = lse.dtype
    delta = (dout.to(acc) * out.to(acc)).sum(-1)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    own = torch.zeros((2, *k.shape), dtype=acc, device=k.device)  # my block's dK/dV, step 0
    kv, travelling, sends = torch.stack([k, v]), None, []
    for step in range(cp):
        works, incoming = [], None
        if step < cp - 1:
            incoming = torch.empty_like(kv)
            works = pass_on(kv, incoming, group, KV_TAG)
        part = own if step == 0 else torch.zeros_like(own)
        block = block_of(step, rank, cp, q.shape[2], causal, balanced)
        if block is not None:
            rows, cols, diagonal = block
            qb, kb, vb = q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols]
            with timed(stats, "compute_seconds"):
                bq, bk, bv = online_softmax.block_attention_backward(
                    dout[:, :, rows], qb, kb, vb, lse[:, :, rows], delta[:, :, rows], diagonal
                )
                dq[:, :, rows] += bq
                part[0][:, :, cols] += bk
                part[1][:, :, cols] += bv
            if stats is not None:
                stats.add_block("backward", qb.shape, kb.shape)
        if step > 0:  # add to the dK/dV that came with this block, send it on one step behind
            if travelling is not None:
                _wait(travelling[1], stats)
                part += travelling[0]
            arriving = torch.empty_like(own)
            travelling = (arriving, pass_on(part, arriving, group, DKV_TAG))
            sends.append(part)  # keep the buffer alive until its send is done
        _wait(works, stats)
        kv = incoming
    if travelling is not None:  # my own block's dK/dV from every other rank
        _wait(travelling[1], stats)
        own += travelling[0]
    return dq, own[0], own[1]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, balanced, stats):
        out, lse = ring_forward(q, k, v, group, causal, balanced, stats)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (group, causal, balanced, stats)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(dout, q, k, v, out, lse, *ctx.args)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def ring_attention(q, k, v, group=None, causal=False, *, balanced=True, stats=None):
    """Attention of this rank's queries over the whole sequence's keys and values, each rank
    holding a shard (batch, heads, local_seq, head_dim) of q, k and v; returns this rank's
    shard of the output, equal to scaled_dot_product_attention on the full sequence.

    causal=True expects the load-balanced layout (shard_sequence(x, 2, group, causal=True));
    balanced=False takes the contiguous layout instead (the naive causal split: right, but
    unbalanced). stats: a ContextStats that counts the block products and times the waits."""
    checks.check_attention_inputs(q, k, v, group, causal, balanced, "ring_attention")
    return _RingAttention.apply(q, k, v, group, bool(causal), bool(balanced), stats)
