# Generated from solutions/ex02_broadcast_linear.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 02`.
"""Exercise 02, linear broadcast (lesson 02: the collective zoo).

The root copies its buffer `x` to every other rank; the others receive into their `x`:

    root -> 0, root -> 1, ..., root -> p-1        p - 1 messages of n bytes, all from the root

The simplest broadcast, and the baseline: the root's one link carries (p-1) n bytes, so the
time grows linearly with p. Same signature as minipar's built-in algorithms, so it plugs in:

    minipar.broadcast(x, src=0, algorithm=broadcast_linear)

Grade it: minipar grade 02
"""


def broadcast_linear(call, x, root: int) -> None:
    """Rank `root` sends x to each other rank; the others receive it into x."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
