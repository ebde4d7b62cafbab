# Generated from solutions/ex07_one_f_one_b.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 07`.
"""Exercise 07, the 1F1B schedule (lesson 07: pipeline parallelism).

Write the compute order of one rank in a 1F1B (PipeDream-flush) pipeline of p ranks and m
micro-batches, as a list of instructions from minipar.parallel.pipeline.schedules:
`Forward(mb)` and `Backward(mb)`. (The messages are added for you by `with_comms`.)

    warm-up:    rank r runs min(p - r - 1, m) forwards first
    steady:     then one forward, one backward, one forward, one backward, ...
    cool-down:  then the backwards still owed

Each backward frees the activations of one micro-batch, so rank r never holds more than p - r
of them. The grader runs your lists through minipar's verifier (no deadlock, every message
received, every micro-batch forward and backward) for p = 2..8 and m = 1..16, and checks the
peak activations.

Grade it: minipar grade 07
"""

from minipar.parallel.pipeline.schedules import Backward, Forward


def one_f_one_b(rank: int, p: int, m: int) -> list:
    """The compute instructions of `rank`, in order: m Forwards and m Backwards."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
