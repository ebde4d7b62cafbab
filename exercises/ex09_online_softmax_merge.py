# Generated from solutions/ex09_online_softmax_merge.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 09`.
# The grader admits these imports here (others it refuses, naming the line):
#   torch
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 09, the online-softmax merge (lesson 09: context parallelism).

Ring attention computes a rank's queries against one block of keys at a time, as the blocks
come round the ring. For one block, with scores s_j = q.k_j / sqrt(head_dim), the partial result
of each query is

    out = sum_j softmax(s)_j v_j        shape (..., q_len, head_dim)
    lse = log sum_j exp(s_j)            shape (..., q_len): the log-sum-exp

Write `merge`: the (out, lse) over the keys of two disjoint blocks a and b, from each block's
(out, lse), exactly. The weights of the two blocks are exp(lse_a) and exp(lse_b), out of their
sum; but scores of a few hundred make exp(lse) overflow float32 (inf, then NaN), so rescale by
the running maximum m = max(lse_a, lse_b) first: exp(lse_a - m) and exp(lse_b - m) are at most 1.
A block whose keys were all masked has lse = -inf and out = 0: it must contribute nothing, and
two such blocks give lse = -inf, out = 0 (no NaN).

The grader checks your merge against torch's scaled_dot_product_attention over all the keys (cut
in different places, chained over several blocks), with scores in the hundreds and with empty
blocks, then runs minipar's ring attention with your merge in it, on real ranks. Block i holds
the keys between the cuts (with cuts at 8 on 16 keys: block 0 is keys 0:8, block 1 keys 8:16),
merged left to right; a masked block has every key masked (lse = -inf, out = 0). A failure names
the merge (which block into which keys), out or lse, and the first element off, [batch, head,
query(, feature)].

Grade it: minipar grade 09
"""

import torch


def merge(out_a, lse_a, out_b, lse_b):
    """(out, lse) over the keys of blocks a and b (the shapes of out_a and lse_a)."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
