# Generated from solutions/ex05_naive_ddp.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 05`.
# The grader admits these imports here (others it refuses, naming the line):
#   minipar, torch
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 05, naive data parallelism (lesson 05: data parallelism).

Every rank holds the same model and computes gradients on its own slice of the batch. To take
the step the full batch would take, every gradient must become the average over the ranks:
all-reduce each parameter's .grad (SUM), then divide by the group size. One all-reduce per
parameter: correct, but a model with hundreds of tensors pays the latency (alpha) hundreds of
times, and nothing overlaps with backward. Lesson 05 then buckets them (ex05_bucketed_ddp).

Traps: a tied weight (one Parameter used in two places) is ONE tensor: module.parameters()
lists it once, so reduce it once. A parameter whose .grad is None on some rank (unused there)
must still be reduced by every rank, or the ranks' collectives no longer match: use zeros.

The grader compares every .grad with the full batch's on 2 and 4 ranks (a failure names the
parameter, the element and, when every element is off by one factor, the factor: 2 on 2 ranks
is a sum that was not averaged), and counts one all-reduce per trainable parameter.

Grade it: minipar grade 05
"""

import torch

import minipar


def all_reduce_gradients(module, group=None) -> None:
    """After backward: every trainable parameter's .grad becomes the average over the group."""
    size = minipar.get_world_size(group)
    for p in module.parameters():  # each Parameter once, tied ones included
        if not p.requires_grad:
            continue
        raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
