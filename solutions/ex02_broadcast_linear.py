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
    # BEGIN SOLUTION hint: on the root, call.isend(x, q) to every q != root, then
    # hint: call.wait(requests); everyone else: call.recv(x, root)
    if call.rank == root:
        requests = [call.isend(x, q) for q in range(call.size) if q != root]
        call.wait(requests)
    else:
        call.recv(x, root)
    # END SOLUTION
