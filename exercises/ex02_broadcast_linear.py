# Generated from solutions/ex02_broadcast_linear.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 02`.
# The grader admits these imports here (others it refuses, naming the line):
#   none of minipar's
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 02, linear broadcast (lesson 02: the collective zoo).

The root copies its buffer `x` to every other rank; the others receive into their `x`:

    root -> 0, root -> 1, ..., root -> p-1        p - 1 messages of n bytes, all from the root

The simplest broadcast, and the baseline: the root's one link carries (p-1) n bytes, so the
time grows linearly with p. Same signature as minipar's built-in algorithms, so it plugs in:

    minipar.broadcast(x, src=0, algorithm=broadcast_linear)

The grader runs the worked solution beside yours on the same input and, when a test fails,
names the first step where your messages or buffers part from it ("step 0: rank 0 sent all of
x (148 B) to rank 2; the reference sends ... to rank 1"); steps are numbered by call.rounds(),
from 0. A wait on a message the solution does not post at that step fails after 1 s.

Grade it: minipar grade 02
"""


def broadcast_linear(call, x, root: int) -> None:
    """Rank `root` sends x to each other rank; the others receive it into x."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
