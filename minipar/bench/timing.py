"""How one benchmark cell is timed, the same way for minipar, MPI and torch.

    warm up W calls
    repeat K times:   barrier;  t0 = clock;  op();  t = clock - t0     (on every rank)
    per iteration, the time is the max over ranks (the collective is done when the last rank is)
    report median, min and max of those K times

K adapts to the size when not given: enough iterations to fill `budget` seconds, between
MIN_ITERS and MAX_ITERS, decided from the slowest rank's warm-up so every rank agrees.
"""

from __future__ import annotations

import time

MIN_ITERS, MAX_ITERS = 5, 2000


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

    def cell(self, op, iters: int | None, warmup: int, budget: float) -> list[float]:
        """Per-iteration times (max over ranks) of op, on every rank."""
        warm = [self.once(op) for _ in range(max(1, warmup))]
        if iters is None:
            slowest = self.max_over_ranks(min(warm))
            iters = int(min(MAX_ITERS, max(MIN_ITERS, budget / max(slowest, 1e-7))))
        times = [self.once(op) for _ in range(iters)]
        return [float(t) for t in self.max_over_ranks(times)]
