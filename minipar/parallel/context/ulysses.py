"""Ulysses attention: an all-to-all turns the sequence split into a head split, attention runs on
full sequences, and a second all-to-all turns it back (DeepSpeed-Ulysses, Jacobs et al. 2023).

    out = ulysses_attention(q, k, v, group=cp_group, causal=True)   # q, k, v: this rank's shard

Heads are independent, so a rank that holds *all* the tokens of h/cp heads can run ordinary
attention on them. Rank r sends head group j of its tokens to rank j and receives its own head
group of every rank's tokens: lesson 02's all-to-all, on (batch, heads, seq, head_dim).

    before (seq split)             all-to-all           after (head split)
    rank 0: tokens 0-3, heads 0-3      -->              rank 0: tokens 0-7, heads 0-1
    rank 1: tokens 4-7, heads 0-3      -->              rank 1: tokens 0-7, heads 2-3

Steps and bytes per rank (N = the bytes of one shard of q, = of k, v and out):
    forward   3 all-to-alls (q, k, v: sequence -> heads), attention, 1 all-to-all back (out:
              heads -> sequence); each sends (cp - 1)/cp N (pairwise: cp - 1 steps)
    backward  the reverse: dout heads <- sequence, attention's backward, dq, dk, dv back: 4 more
Messages: 4 x (cp - 1) per pass, against the ring's cp - 1; bytes: 4 (cp - 1)/cp N against the
ring's (cp - 1) 2N, so Ulysses sends less for cp > 2 and its message count does not grow with
the sequence. But cp cannot exceed the number of heads (heads must divide by cp: a ValueError
otherwise), and the all-to-alls sit on the critical path, with nothing to overlap them with.

Causal: the shards come in the same layout as ring_attention's (load-balanced for causal=True,
shard_sequence's), so a model can switch variants; after the first all-to-all each rank puts the
tokens back in their global order for the causal mask and undoes it before the last one.
The attention itself is torch's scaled_dot_product_attention, with autograd's own backward.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from minipar import collectives, runtime
from minipar.parallel.context import checks, layout
from minipar.parallel.context.stats import timed


def _all_to_all(send, group, stats):
    recv = torch.empty_like(send)
    with timed(stats, "wait_seconds"):  # blocking: nothing overlaps it
        collectives.all_to_all_single(recv, send, group=group)
    return recv


def sequence_to_heads(x, group, stats=None):
    """(batch, heads, local_seq, d) -> (batch, heads/cp, cp x local_seq, d), one all-to-all:
    block j of what this rank sends is head group j (for rank j); block i of what it receives
    is rank i's tokens of this rank's head group."""
    cp = runtime.get_world_size(group)
    b, h, n, d = x.shape
    send = x.reshape(b, cp, h // cp, n, d).transpose(0, 1).contiguous()
    recv = _all_to_all(send, group, stats)  # (cp: source rank, b, h/cp, n, d)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * n, d)


def heads_to_sequence(x, group, stats=None):
    """(batch, heads/cp, cp x local_seq, d) -> (batch, heads, local_seq, d), the inverse."""
    cp = runtime.get_world_size(group)
    b, hc, s, d = x.shape
    send = x.reshape(b, hc, cp, s // cp, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = _all_to_all(send, group, stats)  # (cp: source rank's head group, b, h/cp, n, d)
    return recv.transpose(0, 1).reshape(b, cp * hc, s // cp, d)


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, stats):
        ctx.args = (group, stats)
        return sequence_to_heads(x, group, stats)

    @staticmethod
    def backward(ctx, grad):
        return heads_to_sequence(grad, *ctx.args), None, None


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, stats):
        ctx.args = (group, stats)
        return heads_to_sequence(x, group, stats)

    @staticmethod
    def backward(ctx, grad):
        return sequence_to_heads(grad, *ctx.args), None, None


class _CountBackward(torch.autograd.Function):
    """Identity whose backward counts the attention's backward as one block product."""

    @staticmethod
    def forward(ctx, out, stats, q_shape, k_shape):
        ctx.stats, ctx.shapes = stats, (q_shape, k_shape)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        ctx.stats.add_block("backward", *ctx.shapes)
        return grad, None, None, None


def ulysses_attention(q, k, v, group=None, causal=False, *, balanced=True, stats=None):
    """This rank's shard of attention over the full sequence (as ring_attention: q, k, v shaped
    (batch, heads, local_seq, head_dim), the layout of shard_sequence with the same causal
    flag; balanced=False: the contiguous layout even when causal). heads must divide by cp."""
    cp, _ = checks.check_attention_inputs(q, k, v, group, causal, balanced, "ulysses_attention")
    if cp == 1:  # nothing to exchange: the dense attention itself
        qh, kh, vh = q, k, v
    else:
        qh, kh, vh = (_SequenceToHeads.apply(t, group, stats) for t in (q, k, v))
    order = None
    if causal and balanced and cp > 1:  # rank-ordered chunks -> global token order, and back
        order = layout.gathered_order(cp, qh.shape[2], causal=True).to(qh.device)
        natural = torch.argsort(order)
        qh, kh, vh = (t.index_select(2, natural) for t in (qh, kh, vh))
    with timed(stats, "compute_seconds"):
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    if stats is not None:
        stats.add_block("forward", qh.shape, kh.shape)
        out = _CountBackward.apply(out, stats, qh.shape, kh.shape)
    if order is not None:
        out = out.index_select(2, order)
    return out if cp == 1 else _HeadsToSequence.apply(out, group, stats)
