"""Seconds per message-step on this machine with n ranks: the planner's latency when ranks
outnumber cores.

    link = step_latency.measure(8)          # launches 8 ranks; link.alpha: seconds per step
    python -m minipar.bench.step_latency 8 link.json    # the same from a shell

Each rank runs `calls` ring all-reduces of a few bytes back to back (2 (n-1) steps each, every
step a send to one neighbour and a receive from the other), in `blocks` timed blocks; a block's
time is the slowest rank's, and the answer is the median block's time / (calls x 2 (n-1)).
With one rank per core a step costs the link's alpha (tens of microseconds here); with more
ranks than cores a rank that waits for a peer must wait until the scheduler runs that peer, so
a step costs about a time slice (milliseconds), whatever the message's size. No datasheet has
that number: the planner takes it from here (planner.calibrated_cpu). The link is stored with
cost.save_link, like `minipar bench --fit`'s, with beta and gamma from cost.SHARED_MEMORY.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

NBYTES = 8  # a few bytes: the time is latency alone


def time_per_step(group=None, nbytes: int = NBYTES, calls: int = 20, blocks: int = 7) -> dict:
    """On every rank of `group` (collective): seconds per ring step, the median of `blocks`
    blocks of `calls` back-to-back ring all-reduces of `nbytes` bytes, and each block's time."""
    import numpy as np

    import minipar

    p = minipar.get_world_size(group)
    if p < 2:
        raise ValueError(f"a message-step needs at least 2 ranks, got a group of {p}")
    x, worst = np.zeros(max(1, nbytes // 8)), np.zeros(1)
    for _ in range(3):  # warm up: first calls import, allocate and pick tags
        minipar.all_reduce(x, group=group, algorithm="ring")
    times = []
    for _ in range(blocks):
        minipar.barrier(group=group)
        start = time.perf_counter()
        for _ in range(calls):
            minipar.all_reduce(x, group=group, algorithm="ring")
        worst[0] = time.perf_counter() - start
        minipar.all_reduce(worst, op=minipar.ReduceOp.MAX, group=group)  # outside the timing
        times.append(float(worst[0]))
    steps = calls * 2 * (p - 1)
    return {
        "seconds_per_step": statistics.median(times) / steps,
        "block_seconds": times,
        "steps_per_block": steps,
        "ranks": p,
        "nbytes": nbytes,
    }


def as_link(result: dict, cores: int):
    """The measurement as a cost.Link: alpha the seconds per step, beta and gamma the default
    shared-memory link's (a few bytes measure no bandwidth)."""
    from minipar import cost

    base = cost.SHARED_MEMORY
    source = (
        f"minipar.bench.step_latency: ring all-reduce of {result['nbytes']} B, "
        f"{result['ranks']} ranks on {cores} cores"
    )
    return cost.Link(f"steps:{result['ranks']}on{cores}", result["seconds_per_step"],
                     base.beta, base.gamma, source)  # fmt: skip


def measure(ranks: int, path: str | None = None, timeout: float = 300):
    """Launch `ranks` ranks, time their message-steps, return the Link (saved at `path`)."""
    from minipar import cost, launcher

    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ValueError(f"ranks must be an integer >= 2, got {ranks!r}")
    path = path or os.path.join(tempfile.mkdtemp(prefix="minipar-steps-"), "link.json")
    argv = ["-m", "minipar.bench.step_latency", str(ranks), path]
    done = launcher.run(ranks, argv, timeout=timeout, capture=True)
    if done.returncode != 0:
        raise RuntimeError(f"step_latency on {ranks} ranks failed:\n{done.stderr[-2000:]}")
    return cost.load_link(path)


def main(argv: list[str]) -> int:
    """From a shell: launch N ranks (measure). Under mpiexec: every rank measures, rank 0
    writes the link to LINK.json."""
    import minipar
    from minipar import cost, launcher, runtime

    if len(argv) != 2 or not argv[0].isdigit():
        print("usage: python -m minipar.bench.step_latency N LINK.json", file=sys.stderr)
        return 2
    if not any(name in os.environ for name in runtime._MPI_ENV):
        link = measure(int(argv[0]), argv[1])
        print(f"{link.alpha * 1e3:.3f} ms per message-step ({link.source}); saved {argv[1]}")
        return 0
    minipar.init()
    result = time_per_step()
    if minipar.get_rank() == 0:
        link = as_link(result, launcher.cores())
        cost.save_link(link, argv[1], **result, cores=launcher.cores())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
