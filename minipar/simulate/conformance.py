"""Every collective and every algorithm at p ranks, on real data, checked against numpy.

    wrong = check_collectives(p=97, n=101)   # [] when every rank of every call is right

One simulated world of p ranks makes every call in turn, each with its own algorithm, on values
that are small integers (so every sum is exact in float64 and every algorithm's order of
addition gives the same bits): x_r[i] = (3 r + 7 i) mod 11 on rank r. Sizes n that p does not
divide and roots that are not 0 are the point: an off-by-one at p = 96 shows here and in no
real test (those stop at 8 ranks). Each rank compares its own result with the numpy answer
computed from every rank's input; the list names each (collective, algorithm, rank) that
differs, or raised.
"""

from __future__ import annotations

import numpy as np

from minipar.collectives import api, registry
from minipar.cost.links import Link
from minipar.simulate.cluster import custom
from minipar.simulate.runner import simulate

LINK = Link("conformance", 1e-6, 1e-9, 0.0, "any: only the results are checked")


def data(rank: int, n: int) -> np.ndarray:
    return ((3 * rank + 7 * np.arange(n)) % 11).astype(np.float64)


def checks(p: int, n: int, m: int | None = None):
    """(collective, algorithm, fn(rank) -> (got, want)) for every registered algorithm; the
    block collectives (all-gather, reduce-scatter, scatter, gather, all-to-all) move blocks of
    m elements (default: n up to 64 ranks, else 1, so p^2 m stays small)."""
    root = (p - 1) // 2  # not rank 0 where p > 2
    total = sum(data(r, n) for r in range(p))
    m = m if m is not None else n if p <= 64 else 1
    every = [((5 * r + 3 * np.arange(p * m) + 1) % 13).astype(np.float64) for r in range(p)]
    summed = sum(every)
    gathered = np.concatenate([data(r, m) for r in range(p)])
    columns = np.stack(every).reshape(p, p, m)  # [sender, receiver, element]

    def blocks(rank):  # rank's p blocks of m elements, block j meant for rank j
        return every[rank].copy()

    def broadcast(alg):
        def run(rank):
            x = data(rank, n)
            api.broadcast(x, root, algorithm=alg)
            return x, data(root, n)

        return run

    def all_reduce(alg):
        def run(rank):
            x = data(rank, n)
            api.all_reduce(x, algorithm=alg)
            return x, total

        return run

    def reduce(alg):
        def run(rank):
            x = data(rank, n)
            api.reduce(x, root, algorithm=alg)
            return x, total if rank == root else data(rank, n)

        return run

    def all_gather(alg):
        def run(rank):
            out = np.zeros(p * m)
            api.all_gather_into_tensor(out, data(rank, m), algorithm=alg)
            return out, gathered

        return run

    def reduce_scatter(alg):
        def run(rank):
            out = np.zeros(m)
            api.reduce_scatter_tensor(out, blocks(rank), algorithm=alg)
            return out, summed[rank * m : (rank + 1) * m]

        return run

    def scatter(alg):
        def run(rank):
            out = np.zeros(m)
            parts = list(blocks(root).reshape(p, m)) if rank == root else None
            api.scatter(out, parts, root, algorithm=alg)
            return out, every[root][rank * m : (rank + 1) * m]

        return run

    def gather(alg):
        def run(rank):
            parts = [np.zeros(m) for _ in range(p)] if rank == root else None
            api.gather(data(rank, m), parts, root, algorithm=alg)
            if rank != root:
                return np.zeros(0), np.zeros(0)
            return np.concatenate(parts), gathered

        return run

    def all_to_all(alg):
        def run(rank):
            out = np.zeros(p * m)
            api.all_to_all_single(out, blocks(rank), algorithm=alg)
            return out, columns[:, rank].reshape(-1)

        return run

    def barrier(alg):
        def run(rank):
            api.barrier()
            return np.zeros(0), np.zeros(0)

        return run

    makers = {
        "broadcast": broadcast,
        "all_reduce": all_reduce,
        "reduce": reduce,
        "all_gather": all_gather,
        "reduce_scatter": reduce_scatter,
        "scatter": scatter,
        "gather": gather,
        "all_to_all": all_to_all,
        "barrier": barrier,
    }
    for collective, table in registry.ALGORITHMS.items():
        for alg in sorted(table):
            if collective in makers and alg in registry.BUILTIN[collective]:
                yield collective, alg, makers[collective](alg)


def check_collectives(p: int, n: int, m: int | None = None, per_node: int = 8) -> list[str]:
    """What went wrong, one line each, over every collective and algorithm at p ranks."""
    plan = list(checks(p, n, m))

    def step(rank):
        failures = []
        for collective, alg, run in plan:
            try:
                got, want = run(rank)
            except Exception as error:  # noqa: BLE001 - reported with the call's name
                failures.append(f"{collective} {alg} p={p} n={n} rank {rank}: {error!r}")
                raise
            if got.shape != want.shape or not np.array_equal(got, want):
                failures.append(f"{collective} {alg} p={p} n={n} rank {rank}: wrong result")
        return failures

    try:
        run = simulate(step, p, custom(LINK, per_node))
    except Exception as error:  # noqa: BLE001 - a raise on any rank ends the world
        return [f"p={p} n={n}: {error!r}"]
    return [line for lines in run.results for line in lines]
