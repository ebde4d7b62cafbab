# Generated from solutions/ex09_load_balanced_split.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 09`.
# The grader admits these imports here (others it refuses, naming the line):
#   torch
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 09, the load-balanced causal split (lesson 09: context parallelism).

Under a causal mask token i attends tokens 0..i. Cut a sequence into cp contiguous blocks and
rank r's queries need the keys of ranks 0..r: rank cp-1 works cp times as long as rank 0. The
load-balanced layout cuts the S tokens into 2cp equal chunks and gives rank r chunk r (early,
cheap) and chunk 2cp-1-r (late, dear), head first:

    S = 8, cp = 2    chunks [0 1][2 3][4 5][6 7]    rank 0: tokens 0 1 6 7    rank 1: 2 3 4 5

Write `chunks_of(rank, cp)`, the two chunk numbers rank holds (head first), and
`split(x, dim, rank, cp)`, rank's tokens of x along dim: its two chunks joined into one tensor,
head then tail (x.chunk and torch.cat). When x.shape[dim] does not divide by 2cp, raise
ValueError naming the length and 2cp.

The grader checks the chunks for cp = 1..8, that the ranks' tokens cover the sequence once,
that every rank's causal work (the sum over its tokens i of i + 1 keys) is the same, that split
cuts as minipar's shard_sequence(x, dim, causal=True), and, on real ranks, that minipar's ring
attention on your shards equals dense attention. A failure names cp, the rank and the chunks
or tokens it holds beside the reference's.

Grade it: minipar grade 09
"""

import torch


def chunks_of(rank: int, cp: int) -> tuple[int, int]:
    """The chunks (of 2cp) that rank holds, head first."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")


def split(x: torch.Tensor, dim: int, rank: int, cp: int) -> torch.Tensor:
    """rank's tokens of x along dim: its head chunk, then its tail chunk."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
