"""Seconds per message-step, and per byte of a step, on this machine with n ranks: the planner's
latency and bandwidth when ranks outnumber cores.

    link, measured = step_latency.measure(8)   # 8 ranks: link.alpha, link.beta per step, and
    measured["share"]                           # the share of a core each rank computes with
    python -m minipar.bench.step_latency 8 link.json    # the same from a shell

Each rank runs ring all-reduces back to back (2 (n-1) steps each, every step a send to one
neighbour and a receive from the other) in timed blocks, of a few bytes (latency alone) and of
n x 32 KiB (32 KiB a step, the size of the tiny GPT's activation messages); a block's time is
its slowest rank's, the median block counts. alpha = t_small / steps; beta = the extra time per
step of the large call over its extra bytes per step. With a core per rank a step costs tens of
microseconds here and a byte what a memory copy costs; with more ranks than cores a rank that
waits for a peer waits until the scheduler runs that peer, and a large message crosses in
several turns: no datasheet has those numbers, so the planner takes them from here
(planner.calibrated_cpu). Stored with cost.save_link, like `minipar bench --fit`'s link.

The same launch measures the share of a core each rank computes with (compute_share): small
matmuls on one rank alone, then on every rank at once. cores / ranks on an idle machine; less
where other jobs share the cores, which the planner's cores / ranks would not see.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

SMALL, LARGE_PER_STEP = 8, 32 << 10  # bytes: a whole small call; a large call's bytes per step
SLEEP = 0.5  # seconds the other ranks sleep while rank 0 computes alone


def _block_seconds(x, group, calls: int, blocks: int) -> list[float]:
    """The slowest rank's time for `calls` ring all-reduces of x, `blocks` times."""
    import numpy as np

    import minipar

    worst, times = np.zeros(1), []
    for _ in range(2):  # warm up: the first calls allocate and pick tags
        minipar.all_reduce(x, group=group, algorithm="ring")
    for _ in range(blocks):
        minipar.barrier(group=group)
        start = time.perf_counter()
        for _ in range(calls):
            minipar.all_reduce(x, group=group, algorithm="ring")
        worst[0] = time.perf_counter() - start
        minipar.all_reduce(worst, op=minipar.ReduceOp.MAX, group=group)  # outside the timing
        times.append(float(worst[0]))
    return times


def time_per_step(group=None, calls: int = 10, blocks: int = 5) -> dict:
    """On every rank of `group` (collective): alpha (seconds per ring step) and beta (seconds
    per byte a step sends), from the median blocks of small and large ring all-reduces."""
    import numpy as np

    import minipar

    p = minipar.get_world_size(group)
    if p < 2:
        raise ValueError(f"a message-step needs at least 2 ranks, got a group of {p}")
    steps = 2 * (p - 1)
    small = _block_seconds(np.zeros(SMALL // 4, np.float32), group, calls, blocks)
    large = _block_seconds(np.zeros(p * LARGE_PER_STEP // 4, np.float32), group, calls, blocks)
    share = compute_share(group)
    t_small = statistics.median(small) / (calls * steps)
    t_large = statistics.median(large) / (calls * steps)
    return {
        "alpha": t_small,
        "beta": max(t_large - t_small, 0.0) / (LARGE_PER_STEP - SMALL / p),
        "share": share,
        "small_block_seconds": small,
        "large_block_seconds": large,
        "calls_per_block": calls,
        "ranks": p,
        "bytes": [SMALL, p * LARGE_PER_STEP],
    }


def compute_share(group=None, reps: int = 200, blocks: int = 3) -> float:
    """The share of a core each rank gets when all of the group's ranks compute at once: the
    time of `reps` small matmuls on rank 0 alone (the others asleep, not polling; the fastest
    block) over their time when every rank runs them (the slowest rank, median block).
    cores / ranks on an idle machine, less when other processes share the cores too."""
    import numpy as np

    import minipar

    a, b = np.ones((512, 64), np.float32), np.ones((64, 256), np.float32)
    worst, alone, together = np.zeros(1), [], []
    for _ in range(blocks):
        for every in (False, True):
            minipar.barrier(group=group)
            start = time.perf_counter()
            if every or minipar.get_rank(group) == 0:
                for _ in range(reps):
                    a @ b
            else:
                time.sleep(SLEEP)  # longer than rank 0's block: rank 0 has the core alone
            worst[0] = time.perf_counter() - start
            if not every:
                worst[0] = worst[0] if minipar.get_rank(group) == 0 else 0.0
            minipar.all_reduce(worst, op=minipar.ReduceOp.MAX, group=group)
            (together if every else alone).append(float(worst[0]))
    if min(alone) >= SLEEP:
        raise RuntimeError(f"{reps} matmuls took {min(alone):.2f} s alone: too slow to measure")
    return min(1.0, min(alone) / statistics.median(together))


def as_link(result: dict, cores: int):
    """The measurement as a cost.Link (gamma: the default shared-memory link's)."""
    from minipar import cost

    source = (
        f"minipar.bench.step_latency: ring all-reduces of {result['bytes']} B, "
        f"{result['ranks']} ranks on {cores} cores"
    )
    name = f"steps:{result['ranks']}on{cores}"
    return cost.Link(name, result["alpha"], result["beta"], cost.SHARED_MEMORY.gamma, source)


def measure(ranks: int, path: str | None = None, timeout: float = 300) -> tuple:
    """Launch `ranks` ranks, time their message-steps and compute share: (the Link, every
    measured number), saved at `path`."""
    from minipar import cost, launcher

    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ValueError(f"ranks must be an integer >= 2, got {ranks!r}")
    path = path or os.path.join(tempfile.mkdtemp(prefix="minipar-steps-"), "link.json")
    argv = ["-m", "minipar.bench.step_latency", str(ranks), path]
    done = launcher.run(ranks, argv, timeout=timeout, capture=True)
    if done.returncode != 0:
        raise RuntimeError(f"step_latency on {ranks} ranks failed:\n{done.stderr[-2000:]}")
    with open(path) as f:
        measured = json.load(f)["measured"]
    return cost.load_link(path), measured


def main(argv: list[str]) -> int:
    """From a shell: launch N ranks (measure). Under mpiexec: every rank measures, rank 0
    writes the link to LINK.json."""
    import minipar
    from minipar import cost, launcher, runtime

    if len(argv) != 2 or not argv[0].isdigit():
        print("usage: python -m minipar.bench.step_latency N LINK.json", file=sys.stderr)
        return 2
    if not any(name in os.environ for name in runtime._MPI_ENV):
        link, measured = measure(int(argv[0]), argv[1])
        rate = 1 / link.beta / 1e6 if link.beta else float("inf")
        print(
            f"{link.alpha * 1e3:.3f} ms per message-step, {rate:.3g} MB/s, "
            f"{measured['share']:.2f} of a core per rank ({link.source})"
        )
        return 0
    minipar.init()
    result = time_per_step()
    if minipar.get_rank() == 0:
        link = as_link(result, launcher.cores())
        cost.save_link(link, argv[1], **result, cores=launcher.cores())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
