"""What debug mode costs: the median time of a tiny all-reduce with and without it.

    minipar run -n 2 tests/ranks/reliability_overhead.py            # the figure in docs/errors.md
    minipar run -n 4 tests/ranks/reliability_overhead.py --iters 5000 --nbytes 8

Blocks of calls with debug off and on alternate, so a machine that gets busier half-way hurts
both sides alike; rank 0 prints the medians of the per-call times (max over ranks per call).
"""

import argparse
import time

import numpy as np

import minipar


def timed_block(x, iters: int, debug: bool) -> np.ndarray:
    """Per-call seconds for `iters` all-reduces (a barrier first, so ranks start together)."""
    minipar.init(debug=debug)
    minipar.barrier()
    times = np.empty(iters)
    for i in range(iters):
        start = time.perf_counter()
        minipar.all_reduce(x, algorithm="recursive_doubling")
        times[i] = time.perf_counter() - start
    minipar.init(debug=False)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--nbytes", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=10)
    args = parser.parse_args()
    w = minipar.init()
    x = np.zeros(max(1, args.nbytes // 8))
    timed_block(x, 200, False)  # warm up both paths
    timed_block(x, 200, True)
    plain, checked = [], []
    for _ in range(args.blocks):
        plain.append(timed_block(x, args.iters // args.blocks, False))
        checked.append(timed_block(x, args.iters // args.blocks, True))
    plain, checked = np.concatenate(plain), np.concatenate(checked)
    everyone = w.allgather_object((plain, checked))
    plain = np.max([p for p, _ in everyone], axis=0)  # a call ends when its slowest rank does
    checked = np.max([c for _, c in everyone], axis=0)
    if w.rank == 0:
        a, b = np.median(plain) * 1e6, np.median(checked) * 1e6
        print(
            f"{w.size} ranks, {x.nbytes}-byte all_reduce, {len(plain)} calls each: "
            f"median {a:.1f} us without debug, {b:.1f} us with debug "
            f"(+{b - a:.1f} us, x{b / a:.2f})"
        )
    minipar.finalize()


if __name__ == "__main__":
    main()
