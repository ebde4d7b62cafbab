# Generated from solutions/ex07_one_f_one_b.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 07`.
# The grader admits these imports here (others it refuses, naming the line):
#   minipar.parallel.pipeline.schedules.Backward, minipar.parallel.pipeline.schedules.Forward
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 07, the 1F1B schedule (lesson 07: pipeline parallelism).

Write the compute order of one rank in a 1F1B (PipeDream-flush) pipeline of p ranks and m
micro-batches, as a list of instructions from minipar.parallel.pipeline.schedules:
`Forward(mb)` and `Backward(mb)`. (The messages are added for you by `with_comms`.)

    warm-up:    rank r runs min(p - r - 1, m) forwards first
    steady:     then one forward, one backward, one forward, one backward, ...
    cool-down:  then the backwards still owed

Each backward frees the activations of one micro-batch, so rank r never holds more than p - r
of them. The grader checks, for p = 2..8 and m = 1..16, on every rank:

  1. your list is exactly this order (1F1B's, as minipar.parallel.pipeline.schedules makes it;
     another order with the same peak and bubble fails this test);
  2. minipar's verifier runs every rank's list with its messages: no deadlock, every message
     received, every micro-batch forward and backward;
  3. rank r holds at most min(p - r, m) micro-batches' activations, and the bubble is
     (p - 1) / (m + p - 1) of the time.

A failure names p, m, the rank and the first instruction (counted from 0, compute only) where
yours differs, yours beside the reference's (F2 = Forward(2), B0 = Backward(0)); or the
expected and the measured peak.

Grade it: minipar grade 07
"""

from minipar.parallel.pipeline.schedules import Backward, Forward


def one_f_one_b(rank: int, p: int, m: int) -> list:
    """The compute instructions of `rank`, in order: m Forwards and m Backwards."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
