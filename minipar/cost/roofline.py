"""The roofline of a collective on one machine: the least time any implementation could take.

Ranks that share one machine's memory move bytes with the same two kernels a CPU has: copy
(read k bytes, write k) and reduce (read 2k, write k, e.g. `np.add(a, b, out=a)`). Measure how
fast each runs, with every rank running it at once (they share the memory bus), and the work a
collective cannot avoid gives a floor under its time.

All-reduce of n bytes on p ranks (each rank has its own n-byte input, must end with the n-byte
result in its own buffer):

    T_min = (p-1)/p * n / add_rate  +  (p-1)/p * n / copy_rate

Why. (1) Reduction: every byte of the result needs p-1 additions, (p-1) n bytes of add work in
all; spread evenly, (p-1)/p n per rank. (2) Distribution: a rank that reduced only its n/p share
still needs the other (p-1)/p n bytes of the result in its buffer, written there by a copy from
memory another rank wrote (read straight from the peer's memory, as single-copy transports such
as XPMEM do: a message through a shared segment would copy twice). A rank could instead reduce
more of the result itself, but a byte it reduces costs p-1 adds, and an add moves more memory
than a copy, so the even split is cheapest. Nothing is assumed about latency: the floor is
bandwidth only, so small messages reach a tiny fraction of it.

Inside one node's shared windows (comm/transport/shm.py) the copy and the reduction read memory that
another core has just written, and that is slower than private memory (the line is fetched from
the writer's cache): `peer_rates` measures it, the rate at which one rank copies or adds in a
buffer its peer wrote a moment ago, every rank at once. The same floor priced at those rates is
the least time a single-copy schedule over windows can take on this machine (a buffer that
lives in the window, `minipar.empty`, does exactly that work: collectives/fast/in_place.py).

The other collectives, the same way (n as in minipar.cost: the whole buffer):
    reduce_scatter  (p-1)/p * n / add_rate           each output block = p blocks added
    reduce          as all_reduce                    the root needs all of it, reduced
    all_gather      n / copy_rate                    every rank writes its whole output
    broadcast       n / copy_rate                    every non-root rank writes n bytes
    all_to_all      n / copy_rate                    every rank writes its whole output
    scatter         n/p / copy_rate                  every rank writes its block
    gather          n / copy_rate                    the root writes the whole output
"""

from __future__ import annotations

import time

MIN_BYTES = 256 << 10


def lower_bound(collective: str, nbytes: float, p: int, copy_rate: float, add_rate: float):
    """Seconds: the floor under `collective` of nbytes on p ranks (rates in bytes/s)."""
    if p == 1:
        return 0.0
    share = (p - 1) / p * nbytes
    floors = {
        "all_reduce": share / add_rate + share / copy_rate,
        "reduce": share / add_rate + share / copy_rate,
        "reduce_scatter": share / add_rate,
        "all_gather": nbytes / copy_rate,
        "broadcast": nbytes / copy_rate,
        "all_to_all": nbytes / copy_rate,
        "scatter": nbytes / p / copy_rate,
        "gather": nbytes / copy_rate,
    }
    if collective not in floors:
        raise ValueError(f"no roofline for {collective!r}; one of {', '.join(sorted(floors))}")
    return floors[collective]


def kernel_rates(nbytes: int, dtype, barrier, reduce_max, min_seconds: float = 0.05):
    """(copy_rate, add_rate) in bytes/s for nbytes-sized buffers, every rank at once.

    `barrier()` lines the ranks up before each repetition and `reduce_max(t)` returns the
    largest of every rank's t, the same on every rank (the kernels finish when the slowest rank
    does; the repetition count must agree). Repeats for about min_seconds (at least 5 times)
    and keeps each kernel's fastest run: a floor should be optimistic, and on a shared machine
    the slow runs are someone else's load. Buffers smaller than MIN_BYTES are measured at MIN_BYTES:
    below that one numpy call costs more than the bytes it moves, and the floor is about
    bandwidth, not call overhead.
    """
    import numpy as np

    count = max(MIN_BYTES, nbytes) // np.dtype(dtype).itemsize
    a, b = np.zeros(count, dtype), np.zeros(count, dtype)
    kernels = {"copy": lambda: np.copyto(b, a), "add": lambda: np.add(a, b, out=a)}
    rates = {}
    for name, kernel in kernels.items():
        kernel()  # touch the pages once
        first = reduce_max(_timed(kernel, barrier))
        times = [
            _timed(kernel, barrier)
            for _ in range(max(5, min(200, int(min_seconds / max(first, 1e-9)))))
        ]
        rates[name] = a.nbytes / max(reduce_max(min(times)), 1e-9)
    return rates["copy"], rates["add"]


def peer_rates(mine, theirs, scratch, barrier, reduce_max, min_seconds: float = 0.05):
    """(copy_rate, add_rate) in bytes/s of reading `theirs`, a peer's buffer in a shared window
    that the peer has just written: before each repetition every rank writes its own buffer
    `mine` (its peers' `theirs`), lines up at `barrier()`, then copies `theirs` into the private
    `scratch` (copy) or adds it into `scratch` (add). Arrays of one dtype and length; every rank
    at once, the fastest repetition (the slowest rank's time, `reduce_max`), as kernel_rates."""
    import numpy as np

    kernels = {"copy": lambda: np.copyto(scratch, theirs), "add": lambda: np.add(scratch, theirs,
               out=scratch)}  # fmt: skip
    rates, turn = {}, [0]

    def fresh():
        barrier()  # nobody still reads my buffer
        turn[0] += 1
        mine.fill(turn[0] % 7)  # the peer reads what was just written: a write pass
        barrier()

    for name, kernel in kernels.items():
        kernel()  # touch the pages once
        first = reduce_max(_timed(kernel, fresh))
        count = max(5, min(50, int(min_seconds / max(first, 1e-9))))  # two barriers each
        times = [_timed(kernel, fresh) for _ in range(count)]
        rates[name] = theirs.nbytes / max(reduce_max(min(times)), 1e-9)
    return rates["copy"], rates["add"]


def _timed(kernel, barrier) -> float:
    barrier()
    start = time.perf_counter()
    kernel()
    return time.perf_counter() - start
