# Generated from solutions/ex05_zero1_step.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 05`.
# The grader admits these imports here (others it refuses, naming the line):
#   minipar, torch
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 05, the ZeRO-1 optimizer step (lesson 05: data parallelism).

Plain data parallelism keeps the whole optimizer state (Adam: two fp32 moments, 8 bytes per
parameter) on every rank. ZeRO stage 1 gives each parameter one owner rank:

  1. partition: owner of each parameter, balanced by element count: take the parameters from
     the largest to the smallest (ties: lower index first) and give each to the rank that owns
     the fewest elements so far (ties: the lowest rank).
  2. zero1_step: the local optimizer (built only on this rank's parameters) steps them; then
     every parameter is broadcast from its owner, so all ranks hold the updated model.

Each rank keeps K * Psi / N_d bytes of state instead of K * Psi. The updated values are the
optimizer's own arithmetic on the same gradients, so they equal a plain optimizer's bitwise.

The grader checks partition on four cases (a failure names the parameter, its size, yours and
the reference's owner, and the elements per rank), then one step on 2 and 4 ranks against a
plain AdamW: a failure names the parameter, whose shard it is, and the root of its broadcast
(broadcast i is the i-th your step makes; it must come from parameter i's owner).

Grade it: minipar grade 05
"""

import torch

import minipar


def partition(sizes: list[int], world: int) -> list[int]:
    """owner[i]: the rank that owns parameter i (sizes[i] elements)."""
    owner, load = [0] * len(sizes), [0] * world
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
    return owner


@torch.no_grad()
def zero1_step(params, owner, local_optimizer, group=None) -> None:
    """local_optimizer steps this rank's parameters; then each parameter is broadcast from its
    owner rank (owner[i] is a rank of the group) to every rank."""
    if local_optimizer is not None:
        local_optimizer.step()
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
