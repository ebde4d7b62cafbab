"""How the benchmark times a call, the same way for minipar, MPI and torch.

    warm up W calls
    repeat K times:   barrier;  t0 = clock;  op();  t = clock - t0     (on every rank)
    per iteration, the time is the max over ranks (the collective is done when the last rank is)
    report median, min and max of those K times

K adapts to the size when not given: enough iterations to fill `budget` seconds, between
MIN_ITERS and MAX_ITERS, decided from the slowest rank's warm-up so every rank agrees.

The cells of one message size (minipar's algorithms, MPI, torch) take turns: ROUNDS rounds, each
timing K / ROUNDS calls of every cell in a row. Each run of calls is its own phase, between
barriers, never concurrent with another; taking turns spreads the shared machine's slow moments
over all of them, so the ratios between implementations are fairer than their absolute times.
"""

from __future__ import annotations

import time

MIN_ITERS, MAX_ITERS = 9, 2000
ROUNDS = 3


class Timer:
    """Barriers and max-over-ranks reductions on the job's MPI communicator."""

    def __init__(self, comm, mpi_comm):
        self.comm, self.mpi = comm, mpi_comm

    def barrier(self) -> None:
        # minipar's transport barrier (Ibarrier, polled with yields): MPI's blocking one spins,
        # which starves the other ranks when they share cores
        self.comm.barrier()

    def max_over_ranks(self, values):
        """Elementwise max of every rank's float array (or float), on every rank."""
        import numpy as np
        from mpi4py import MPI

        array = np.atleast_1d(np.asarray(values, dtype=np.float64))
        out = np.empty_like(array)
        request = self.mpi.Iallreduce(array, out, op=MPI.MAX)
        while not request.Test():
            time.sleep(0)
        return out if np.ndim(values) else float(out[0])

    def once(self, op) -> float:
        self.barrier()
        start = time.perf_counter()
        op()
        return time.perf_counter() - start

    def iterations(self, op, iters: int | None, warmup: int, budget: float) -> int:
        """Warm op up; return how many timed calls it gets (the same on every rank)."""
        warm = [self.once(op) for _ in range(max(1, warmup))]
        if iters is not None:
            return iters
        slowest = self.max_over_ranks(min(warm))
        return int(min(MAX_ITERS, max(MIN_ITERS, budget / max(slowest, 1e-7))))

    def take_turns(self, ops: dict, iters: int | None, warmup: int, budget: float) -> dict:
        """{key: per-iteration times (max over ranks)} for every op of ops {key: op}."""
        counts = {key: self.iterations(op, iters, warmup, budget) for key, op in ops.items()}
        times: dict = {key: [] for key in ops}
        for turn in range(ROUNDS):
            for key, op in ops.items():
                share = counts[key] * (turn + 1) // ROUNDS - counts[key] * turn // ROUNDS
                times[key] += [self.once(op) for _ in range(share)]
        return {key: [float(t) for t in self.max_over_ranks(ts)] for key, ts in times.items()}
