"""Seconds per message-step, and per byte of a step, on this machine with n ranks: the planner's
latency and bandwidth when ranks outnumber cores.

    link, measured = step_latency.measure(8, gpt=True)   # 8 ranks: link.alpha, link.beta per
    measured["share"]                                    # step; the share of a core per rank
    python -m minipar.bench.step_latency 8 link.json [--gpt]   # the same from a shell

Each rank runs ring all-reduces back to back (2 (n-1) steps each, every step a send to one
neighbour and a receive from the other) in timed blocks, of a few bytes (latency alone) and of
n x 32 KiB (32 KiB a step, the size of the tiny GPT's activation messages); a block's time is
its slowest rank's, the median block counts. alpha = t_small / steps; beta = the extra time per
step of the large call over its extra bytes per step. With a core per rank a step costs tens of
microseconds here and a byte what a memory copy costs; with more ranks than cores a rank that
waits for a peer waits until the scheduler runs that peer, and a large message crosses in
several turns: no datasheet has those numbers, so the planner takes them from here
(planner.calibrated_cpu). Stored with cost.save_link, like `minipar bench --fit`'s link.

Idle ranks hand the core over quickly; in training the peer a rank waits for is computing and
keeps the core for its time slice. With `--gpt` alpha is measured busy: every small all-reduce
follows a forward and backward pass of the tiny GPT on every rank, and alpha is what those
blocks take beyond the same passes alone, per step (8 ranks on 2 cores, loaded: ~3 ms busy,
~0.5 ms idle). The same launch measures the share of a core each rank computes with
(compute_share): a block of work on one rank alone, then on every rank at once (numpy matmuls,
or with `--gpt` the GPT's passes: torch's Python and cache traffic too). cores / ranks on an
idle machine; less where other jobs share the cores or the ranks crowd each other out of the
caches, which the planner's cores / ranks would not see.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

import minipar
from minipar import cost, launcher, runtime
from minipar.models.config import GPTConfig

SMALL, LARGE_PER_STEP = 8, 32 << 10  # bytes: a whole small call; a large call's bytes per step
SLEEP = 0.5  # seconds (at least) the other ranks sleep while rank 0 computes alone
TRIES = 3  # measurements of the share, each with a longer sleep, before giving up


def _block_seconds(x, group, calls: int, blocks: int, work=None) -> list[float]:
    """The slowest rank's time for `calls` ring all-reduces of x (None: none), each after a
    block of `work` (None: none), `blocks` times."""
    import numpy as np

    worst, times = np.zeros(1), []
    for _ in range(2 if x is not None else 0):  # warm up: the first calls allocate, pick tags
        minipar.all_reduce(x, group=group, algorithm="ring")
    for _ in range(blocks):
        minipar.barrier(group=group)
        start = time.perf_counter()
        for _ in range(calls):
            if work is not None:
                work()
            if x is not None:
                minipar.all_reduce(x, group=group, algorithm="ring")
        worst[0] = time.perf_counter() - start
        minipar.all_reduce(worst, op=minipar.ReduceOp.MAX, group=group)  # outside the timing
        times.append(float(worst[0]))
    return times


def time_per_step(group=None, calls: int = 10, blocks: int = 5, work=None) -> dict:
    """On every rank of `group` (collective): alpha (seconds per ring step) and beta (seconds
    per byte a step sends), from the median blocks of small and large ring all-reduces; the
    share of a core each rank computes with (compute_share). With `work` (a function, e.g.
    gpt_work(1)), alpha is measured busy: each small all-reduce follows a block of work on every
    rank, and alpha is the time those blocks take beyond the same work without the all-reduces,
    per step (a peer busy computing hands the core over later than an idle one)."""
    import numpy as np

    p = minipar.get_world_size(group)
    if p < 2:
        raise ValueError(f"a message-step needs at least 2 ranks, got a group of {p}")
    steps, tiny = 2 * (p - 1), np.zeros(SMALL // 4, np.float32)
    small = _block_seconds(tiny, group, calls, blocks)
    large = _block_seconds(np.zeros(p * LARGE_PER_STEP // 4, np.float32), group, calls, blocks)
    share = compute_share(group, work, blocks=blocks)
    t_small = statistics.median(small) / (calls * steps)
    t_large = statistics.median(large) / (calls * steps)
    found = {
        "alpha": t_small,
        "alpha_idle": t_small,
        "beta": max(t_large - t_small, 0.0) / (LARGE_PER_STEP - SMALL / p),
        "share": share,
        "small_block_seconds": small,
        "large_block_seconds": large,
        "calls_per_block": calls,
        "ranks": p,
        "bytes": [SMALL, p * LARGE_PER_STEP],
    }
    if work is not None:  # pairs of blocks, with and without, so both see the same load
        n, pairs = max(2, calls // 2), []
        for _ in range(2 * blocks):
            busy = _block_seconds(tiny, group, n, 1, work)[0]
            pairs.append((busy, _block_seconds(None, group, n, 1, work)[0]))
        extra = statistics.median(b - a for b, a in pairs)
        found.update(alpha=max(extra, 0.0) / (n * steps), busy_pairs=pairs)
    return found


def matmul_work(reps: int = 200):
    """A block of `reps` small numpy matmuls (the tiny GPT's MLP shape)."""
    import numpy as np

    a, b = np.ones((512, 64), np.float32), np.ones((64, 256), np.float32)

    def work():
        for _ in range(reps):
            a @ b

    return work


def gpt_work(reps: int = 4):
    """A block of `reps` forward and backward passes of minipar.models' default GPT on one
    sequence: what a rank computes, with its Python and its cache traffic (loads torch)."""
    import torch

    # here, not at the top of the file: torch loads only when used
    from minipar.models.gpt import build_gpt, lm_loss

    config = GPTConfig()
    model = build_gpt(config, 0)
    ids = torch.arange(config.seq_len).remainder(config.vocab_size)[None]

    def work():
        for _ in range(reps):
            lm_loss(model(ids), ids).backward()

    work()  # warm up
    return work


def compute_share(group=None, work=None, blocks: int = 3, repeat: int = 4) -> float:
    """The share of a core each rank gets when all of the group's ranks compute at once: the
    time of `repeat` blocks of `work` (default matmul_work()) on rank 0 alone (the others
    asleep, not polling; the fastest try) over their time when every rank runs them (the
    slowest rank, the median try). cores / ranks on an idle machine; less when other processes
    share the cores, or when the ranks' working sets crowd each other out of the caches."""
    work, rank = work or matmul_work(), minipar.get_rank(group)
    nap = _nap(group, work, rank, repeat)
    for _ in range(TRIES):
        alone, together = _alone_and_together(group, work, rank, repeat, blocks, nap)
        if min(alone) < nap:
            return min(1.0, min(alone) / statistics.median(together))
        # the machine got slower since _nap timed the work: rank 0 was not alone for all of
        # it. Sleep longer and measure again (every rank has the same numbers: the same choice)
        nap = 3 * min(alone)
    raise RuntimeError(f"the work took {min(alone):.2f} s alone: too slow to measure")


def _alone_and_together(group, work, rank: int, repeat: int, blocks: int, nap: float):
    """`blocks` tries of `repeat` blocks of work: on rank 0 alone (the others sleep `nap`),
    then on every rank; each try's time on the slowest rank."""
    import numpy as np

    worst, alone, together = np.zeros(1), [], []
    for _ in range(blocks):
        for every in (False, True):
            minipar.barrier(group=group)
            start = time.perf_counter()
            if every or rank == 0:
                for _ in range(repeat):
                    work()
            else:
                time.sleep(nap)  # longer than rank 0's block: rank 0 has the core alone
            worst[0] = time.perf_counter() - start if every or rank == 0 else 0.0
            minipar.all_reduce(worst, op=minipar.ReduceOp.MAX, group=group)
            (together if every else alone).append(float(worst[0]))
    return alone, together


def _nap(group, work, rank: int, repeat: int) -> float:
    """How long the other ranks sleep while rank 0 computes alone: SLEEP, or three times what
    rank 0's block takes on this machine now (timed once, all ranks told), if that is longer:
    on a loaded machine a block outlasts a fixed nap and the measurement would be void."""
    import numpy as np  # here, not at the top of the file: numpy loads only when measuring

    took = np.zeros(1)
    minipar.barrier(group=group)
    if rank == 0:
        start = time.perf_counter()
        work()
        took[0] = time.perf_counter() - start
    else:
        time.sleep(SLEEP)
    minipar.all_reduce(took, op=minipar.ReduceOp.MAX, group=group)
    return max(SLEEP, 3 * repeat * float(took[0]))


def as_link(result: dict, cores: int):
    """The measurement as a cost.Link (gamma: the default shared-memory link's)."""
    source = (
        f"minipar.bench.step_latency: ring all-reduces of {result['bytes']} B, "
        f"{result['ranks']} ranks on {cores} cores"
    )
    name = f"steps:{result['ranks']}on{cores}"
    return cost.Link(name, result["alpha"], result["beta"], cost.SHARED_MEMORY.gamma, source)


def measure(ranks: int, path: str | None = None, timeout: float = 300, gpt: bool = False):
    """Launch `ranks` ranks, time their message-steps and compute share (with gpt_work if
    `gpt`, else matmul_work): (the Link, every measured number), saved at `path`."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ValueError(f"ranks must be an integer >= 2, got {ranks!r}")
    path = path or os.path.join(tempfile.mkdtemp(prefix="minipar-steps-"), "link.json")
    argv = ["-m", "minipar.bench.step_latency", str(ranks), path, *(["--gpt"] if gpt else [])]
    done = launcher.run(ranks, argv, timeout=timeout, capture=True)
    if done.returncode != 0:
        raise RuntimeError(f"step_latency on {ranks} ranks failed:\n{done.stderr[-2000:]}")
    with open(path) as f:
        measured = json.load(f)["measured"]
    return cost.load_link(path), measured


USAGE = "usage: python -m minipar.bench.step_latency N LINK.json [--gpt]"


def main(argv: list[str]) -> int:
    """From a shell: launch N ranks (measure). Under mpiexec: every rank measures, rank 0
    writes the link to LINK.json."""
    gpt = "--gpt" in argv
    argv = [a for a in argv if a != "--gpt"]
    if len(argv) != 2 or not argv[0].isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    if not any(name in os.environ for name in runtime.world.MPI_ENV):
        link, measured = measure(int(argv[0]), argv[1], gpt=gpt)
        rate = 1 / link.beta / 1e6 if link.beta else float("inf")
        print(
            f"{link.alpha * 1e3:.3f} ms per message-step, {rate:.3g} MB/s, "
            f"{measured['share']:.2f} of a core per rank ({link.source})"
        )
        return 0
    minipar.init()
    result = time_per_step(work=gpt_work(1) if gpt else None)
    if minipar.get_rank() == 0:
        link = as_link(result, launcher.cores())
        work = "gpt" if gpt else "matmul"
        cost.save_link(link, argv[1], **result, cores=launcher.cores(), work=work)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
