# Generated from solutions/ex02_ring_shift.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 02`.
# The grader admits these imports here (others it refuses, naming the line):
#   none of minipar's
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 02, ring shift (lesson 02: ranks and point-to-point).

Every rank sends its buffer `x` to the rank `shift` places to its right and receives, into
`out`, the buffer of the rank `shift` places to its left:

    out on rank r  <-  x of rank (r - shift) mod p          (p ranks, 4 here, shift 1)
    0 -> 1 -> 2 -> 3 -> 0

`call` is what minipar hands every algorithm: call.rank, call.size and the point-to-point
methods call.send, call.recv, call.sendrecv, call.isend, call.irecv, call.wait. Careful: if
every rank sends before it receives, large messages deadlock (minipar lesson 02 --break
send-first).

The grader runs the worked solution beside yours on the same input and, when a test fails,
names the first step where your messages or buffers part from it ("step 0: rank 0 sent all of
x (148 B) to rank 2; the reference sends ... to rank 1"); steps are numbered by call.rounds(),
from 0. A wait on a message the solution does not post at that step fails after 1 s.

Grade it: minipar grade 02
"""


def ring_shift(call, x, out, shift: int = 1) -> None:
    """out <- x of rank (rank - shift) mod size; x goes to rank (rank + shift) mod size."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
