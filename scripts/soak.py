"""Soak: many randomized collective calls, each checked against numpy on every rank.

    minipar run -n 4 scripts/soak.py --calls 10000 --seed 7       # the full form
    minipar run -n 3 scripts/soak.py --calls 200 --max-bytes 64KiB  # the short form (tests)

Every rank draws the same sequence of calls from the seed: collective, algorithm (every name
minipar.algorithms lists, auto included), dtype, size (0 to --max-bytes, log-uniform), group (the
world or one of a few sub-groups made at the start), root, op, and blocking or async (async calls
pile up, up to 8, and are waited in random order). Ranks outside a call's group skip it, so the
calls keep one global order and nothing can deadlock. Every rank's inputs are small integers
drawn from (seed, call, rank), so every rank computes the numpy reference of every call it makes,
and sums and products are exact in every dtype: results must match bit for bit (AVG: within a
few ulps, as it divides). The first wrong result, error or timeout ends the job non-zero, naming
the call and the seed to replay it with; rank 0 prints a summary line at the end.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import minipar

DTYPES = ["float64", "float32", "float16", "int64", "int32", "int8", "uint8"]
COLLECTIVES = [
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather_into_tensor",
    "all_gather",
    "reduce_scatter_tensor",
    "scatter",
    "gather",
    "all_to_all_single",
    "barrier",
]
MAX_PENDING = 8


def parse_bytes(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "B": 1}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def make_groups(world, rng):
    """The world and a few sub-groups, made in the same order on every rank."""
    p = world.size
    members = [list(range(p)), list(range(0, p, 2)), list(range(1, p, 2)) or [0]]
    members += [list(range(p // 2)) or [0], sorted(rng.choice(p, rng.integers(1, p + 1), False))]
    groups = []
    for ranks in members:
        ranks = [int(r) for r in ranks]
        groups.append((ranks, world if ranks == list(range(p)) else minipar.new_group(ranks)))
    return groups


def draw(rng, groups, max_bytes: int) -> dict:
    """One call's description (the same on every rank: every rank draws from the same rng)."""
    ranks, group = groups[0] if rng.random() < 0.5 else groups[rng.integers(len(groups))]
    collective = COLLECTIVES[rng.integers(len(COLLECTIVES))]
    name = "barrier" if collective == "barrier" else collective
    algorithms = minipar.algorithms(name)
    dtype = np.dtype(DTYPES[rng.integers(len(DTYPES))])
    nbytes = 0 if rng.random() < 0.05 else int(np.exp(rng.uniform(0, np.log(max_bytes + 1))))
    block = nbytes // dtype.itemsize // max(1, len(ranks))  # per-rank block: totals stay bounded
    ops = ["sum", "product", "min", "max"] + (["avg"] if dtype.kind == "f" else [])
    return dict(
        ranks=ranks,
        group=group,
        collective=collective,
        algorithm=algorithms[rng.integers(len(algorithms))],
        dtype=dtype,
        block=block,
        root=int(rng.integers(len(ranks))),
        op=ops[rng.integers(len(ops))],
        async_op=bool(rng.random() < 0.3),
    )


def inputs(seed: int, i: int, rank: int, spec, n: int) -> np.ndarray:
    """Rank `rank`'s input of call i: small integers, so every reduction is exact."""
    rng = np.random.default_rng([seed, i, rank])
    low, high = (-2, 3) if spec["op"] == "product" else (-4, 5)
    if spec["dtype"].kind == "u":
        low, high = 0, 3
    return rng.integers(low, high, n).astype(spec["dtype"])


def reduce_ref(arrays, op: str, dtype):
    with np.errstate(over="ignore"):
        if op in ("sum", "avg"):
            out = np.sum(arrays, axis=0, dtype=dtype)
            return out / dtype.type(len(arrays)) if op == "avg" else out
        if op == "product":
            return np.prod(arrays, axis=0, dtype=dtype)
        return (np.min if op == "min" else np.max)(arrays, axis=0)


def run_call(seed: int, i: int, spec, me: int):
    """Start call i on this rank (group rank `me`); returns (work or None, check function)."""
    c, g, p, n = spec["collective"], spec["group"], len(spec["ranks"]), spec["block"]
    kw = dict(group=g, algorithm=spec["algorithm"], async_op=spec["async_op"])
    mine = lambda size: inputs(seed, i, spec["ranks"][me], spec, size)  # noqa: E731
    every = lambda size: [inputs(seed, i, spec["ranks"][q], spec, size) for q in range(p)]  # noqa: E731
    root, op, dtype = spec["root"], spec["op"], spec["dtype"]
    if c == "barrier":
        return minipar.barrier(**kw), lambda: None
    if c == "broadcast":
        x = mine(n)
        want = every(n)[root]
        return minipar.broadcast(x, root, **kw), lambda: compare(x, want, op)
    if c in ("all_reduce", "reduce"):
        x = mine(n)
        want = reduce_ref(every(n), op, dtype) if c == "all_reduce" or me == root else x.copy()
        work = (
            minipar.all_reduce(x, op=op, **kw)
            if c == "all_reduce"
            else minipar.reduce(x, root, op=op, **kw)
        )
        return work, lambda: compare(x, want, op)
    if c == "all_gather_into_tensor":
        out = np.zeros(p * n, dtype)
        return minipar.all_gather_into_tensor(out, mine(n), **kw), lambda: compare(
            out, np.concatenate(every(n)), op
        )
    if c == "all_gather":
        outs = [np.zeros(n, dtype) for _ in range(p)]
        want = every(n)
        return minipar.all_gather(outs, mine(n), **kw), lambda: [
            compare(o, w, op) for o, w in zip(outs, want)
        ]
    if c == "reduce_scatter_tensor":
        out = np.zeros(n, dtype)
        want = reduce_ref(every(p * n), op, dtype)[me * n : (me + 1) * n]
        return minipar.reduce_scatter_tensor(out, mine(p * n), op=op, **kw), lambda: compare(
            out, want, op
        )
    if c == "scatter":
        out = np.zeros(n, dtype)
        parts = np.split(every(p * n)[root], p)
        work = minipar.scatter(out, list(parts) if me == root else None, root, **kw)
        return work, lambda: compare(out, parts[me], op)
    if c == "gather":
        outs = [np.zeros(n, dtype) for _ in range(p)] if me == root else None
        want = every(n)
        work = minipar.gather(mine(n), outs, root, **kw)
        return work, lambda: [compare(o, w, op) for o, w in zip(outs or [], want)]
    out = np.zeros(p * n, dtype)  # all_to_all_single: block j of rank q goes to rank j, block q
    want = np.concatenate([x[me * n : (me + 1) * n] for x in every(p * n)])
    return minipar.all_to_all_single(out, mine(p * n), **kw), lambda: compare(out, want, op)


def compare(got, want, op: str) -> None:
    if op == "avg" and got.dtype.kind == "f":
        ok = np.allclose(got, want, rtol=4 * np.finfo(got.dtype).eps, atol=0)
    else:
        ok = got.tobytes() == np.asarray(want, dtype=got.dtype).tobytes()
    if not ok:
        bad = np.flatnonzero(got != want)[:5]
        raise AssertionError(f"wrong result at {bad.tolist()}: got {got[bad]}, want {want[bad]}")


def describe(i: int, spec) -> str:
    return (
        f"call {i}: {spec['collective']} (algorithm {spec['algorithm']}) on ranks {spec['ranks']},"
        f" {spec['dtype']} x {spec['block']} per rank, root {spec['root']}, op {spec['op']}, "
        f"{'async' if spec['async_op'] else 'blocking'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=None, help="default: drawn, and printed")
    parser.add_argument("--max-bytes", default="8MiB", help="largest buffer (default 8MiB)")
    args = parser.parse_args()
    world = minipar.init()
    seed = args.seed
    if seed is None:
        seed = world.allgather_object(int(np.random.SeedSequence().entropy % 2**31))[0]
    if world.rank == 0:
        print(f"soak: seed {seed}, {args.calls} calls on {world.size} ranks", flush=True)
    rng = np.random.default_rng(seed)
    groups = make_groups(world, rng)
    max_bytes = parse_bytes(args.max_bytes)
    pending, start, moved = [], time.monotonic(), 0
    for i in range(args.calls):
        spec = draw(rng, groups, max_bytes)
        pick = rng.random()  # drawn by every rank, so the draws stay in step
        if world.rank in spec["ranks"]:
            me = spec["ranks"].index(world.rank)
            try:
                work, check = run_call(seed, i, spec, me)
            except Exception as error:
                raise RuntimeError(f"seed {seed}, {describe(i, spec)}: {error}") from error
            pending.append((i, spec, work, check))
            moved += spec["block"] * spec["dtype"].itemsize
        while pending and (len(pending) > MAX_PENDING or pick < 0.5 or i == args.calls - 1):
            j, s, work, check = pending.pop(int(pick * len(pending)) % len(pending))
            try:
                if work is not None:
                    work.wait()
                check()
            except Exception as error:
                raise RuntimeError(f"seed {seed}, {describe(j, s)}: {error}") from error
            pick = 1.0 if i < args.calls - 1 else 0.0
        if world.rank == 0 and (i + 1) % 1000 == 0:
            print(f"soak: {i + 1} calls, {time.monotonic() - start:.0f} s", flush=True)
    minipar.barrier()
    totals = world.allgather_object(moved)
    if world.rank == 0:
        print(
            f"soak: seed {seed}: {args.calls} calls on {world.size} ranks, all results right, "
            f"0 mismatches, 0 hangs; {sum(totals) / 2**20:.1f} MiB of inputs in "
            f"{time.monotonic() - start:.1f} s",
            flush=True,
        )
    minipar.finalize()


if __name__ == "__main__":
    sys.exit(main())
