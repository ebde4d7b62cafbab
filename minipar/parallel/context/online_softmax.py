"""The online softmax: attention over keys that arrive a block at a time, merged exactly without
ever holding all of them (Milakov and Gimelshein 2018; FlashAttention, Dao et al. 2022).

For one query and a block of keys, with scores s_j = q.k_j / sqrt(head_dim) (the scale of
torch's scaled_dot_product_attention), a block's partial result is

    out = sum_j softmax(s)_j v_j          lse = log sum_j exp(s_j)     (the log-sum-exp)

and two partial results over disjoint key blocks a and b combine into the result over both:

    m   = max(lse_a, lse_b)                                   the running maximum
    lse = m + log(exp(lse_a - m) + exp(lse_b - m))
    out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b

Subtracting m first keeps every exponential in (0, 1]; exp(lse_a) itself overflows float32 once
a score passes about 88, and a merge that skips the rescaling is the bug of lesson 09's lab.

    keys:   [ block 0 ][ block 1 ][ block 2 ]        (arriving one by one around the ring)
    (out, lse) --merge--> (out, lse) --merge--> (out, lse)   ==  softmax over all the keys

Backward needs no merge: given the final lse, p = exp(s - lse) is a block's exact share of the
full softmax, so each block's dq, dk, dv follow from its own scores (FlashAttention-2's
backward, Dao 2023), with delta = rowsum(dout * out) computed once per query.

No communication here: these are the per-block kernels ring.py calls. Sums run in float32 (or
float64 for float64 inputs); out and lse come back in that precision.
"""

from __future__ import annotations

import math

import torch


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precisions, else the dtype itself (float32, float64)."""
    return torch.promote_types(dtype, torch.float32)


def _scores(q, k, causal: bool) -> torch.Tensor:
    """(..., q_len, k_len) scaled scores in the accumulation dtype; causal masks key j > query i
    of the block (the diagonal block of a causal attention: q_len == k_len)."""
    acc = accumulation_dtype(q.dtype)
    s = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        hidden = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(hidden, float("-inf"))
    return s


def block_attention(q, k, v, causal: bool = False):
    """Attention of q (..., q_len, d) over one block of keys and values (..., k_len, d):
    (out (..., q_len, d), lse (..., q_len)), both in the accumulation dtype."""
    s = _scores(q, k, causal)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return torch.matmul(p, v.to(s.dtype)), lse


def merge(out_a, lse_a, out_b, lse_b):
    """The (out, lse) over the keys of both blocks, from each block's (out, lse). A block whose
    keys were all masked (lse = -inf, out = 0) contributes nothing."""
    # BEGIN ANSWER ex09_online_softmax_merge
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # both empty: no shift needed
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)  # each in [0, 1], one of them 1
    total = wa + wb
    lse = m + torch.log(total)  # -inf where both blocks were empty
    total = torch.where(total == 0, torch.ones_like(total), total)
    out = (wa / total).unsqueeze(-1) * out_a + (wb / total).unsqueeze(-1) * out_b
    return out, lse
    # END ANSWER


def block_attention_backward(dout, q, k, v, lse, delta, causal: bool = False):
    """One block's share of the gradients: (dq, dk, dv) in the accumulation dtype, for queries q
    whose final log-sum-exp over ALL keys is lse and delta = rowsum(dout * out).

        p = exp(s - lse)   dv = p^T dout   dp = dout v^T   ds = p (dp - delta)
        dq = ds k / sqrt(d)   dk = ds^T q / sqrt(d)
    """
    s = _scores(q, k, causal)
    acc, scale = s.dtype, 1.0 / math.sqrt(q.shape[-1])
    p = torch.exp(s - lse.unsqueeze(-1))  # masked scores: exp(-inf) = 0
    dout = dout.to(acc)
    dv = torch.matmul(p.transpose(-1, -2), dout)
    ds = p * (torch.matmul(dout, v.to(acc).transpose(-1, -2)) - delta.unsqueeze(-1))
    dq = torch.matmul(ds, k.to(acc)) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q.to(acc)) * scale
    return dq, dk, dv
