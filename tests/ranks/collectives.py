"""The collectives matrix, run on every rank (see minipar.testing): every collective x algorithm
against numpy (plain math on one process), identical results on every rank, and the trace ledger
against minipar.cost's formulas. References against MPI's own collectives and torch.distributed
(gloo) live in collectives_refs.py.

Inputs are a deterministic function of (rank, case), so every rank can compute the reference for
the whole group locally.

Tolerances: integer and bool results, MIN and MAX, and PRODUCT of values in {-1, 1, 2} are exact
(integer arithmetic wraps modulo 2^bits, the same in any order). Floating SUM and AVG of random
values are compared with the float64 sum of the same (already rounded) inputs, within the
standard bound for summing p terms in any order: |error| <= (p - 1) * eps * sum(|x_i|) (plus one
more eps for AVG's division), eps being the dtype's unit roundoff.
"""

import functools
import hashlib
import os

import numpy as np
import torch

import minipar
from minipar.collectives.reduce_op import ReduceOp
from minipar.comm.transport import buffers

NUMPY = ["float64", "float32", "float16", "int8", "int32", "int64", "uint8", "bool"]
TORCH = ["float32", "bfloat16", "float16", "int32", "int64", "bool"]
OPS = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG]
EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def world():
    return minipar.init()


# -- inputs and references ---------------------------------------------------------------------
def values(rank, count, dtype, op, salt=0):
    """float64 values that are exact in `dtype` when exactness matters (a fresh copy: every
    algorithm's case of a dtype draws the same ones, so they are drawn once a batch)."""
    return _drawn(rank, count, dtype, op, salt).copy()


@functools.cache
def _drawn(rank, count, dtype, op, salt):
    rng = np.random.default_rng(1000 * rank + 7 * count + salt)
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(np.float64)
    if op is ReduceOp.PRODUCT:
        return rng.choice([-1.0, 1.0, 2.0], count)
    if dtype in EPS:
        if op in (ReduceOp.SUM, ReduceOp.AVG):
            return rng.standard_normal(count)
        return np.round(rng.standard_normal(count) * 8)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), count).astype(np.float64)


def make(kind, dtype, v):
    """A buffer of `kind` ('numpy' or 'torch') and dtype holding v (rounded to dtype)."""
    if kind == "numpy":
        return v.astype(dtype)
    if dtype == "bool":
        return torch.from_numpy(v.astype(bool))
    return torch.from_numpy(v).to(getattr(torch, dtype))


def f64(x):
    """The values of a numpy array or torch tensor as float64 numpy."""
    if buffers.is_torch(x):
        return x.detach().to(torch.float64).numpy()
    return x.astype(np.float64)


def reference(parts, dtype, op, kind):
    """Reduce the per-rank inputs (as created) with plain math on one process."""
    p = len(parts)
    if dtype == "bool":
        stack = np.stack([f64(x) != 0 for x in parts])
        out = stack.any(0) if op in (ReduceOp.SUM, ReduceOp.MAX) else stack.all(0)
        return out.astype(np.float64)
    if dtype in EPS:
        stack = np.stack([f64(x) for x in parts])
        table = {
            ReduceOp.SUM: stack.sum(0),
            ReduceOp.AVG: stack.sum(0) / p,
            ReduceOp.PRODUCT: stack.prod(0),
            ReduceOp.MIN: stack.min(0),
            ReduceOp.MAX: stack.max(0),
        }
        return table[op]
    # integers: reduce in the dtype itself so that wrap-around matches
    acc = np.array(f64(parts[0])).astype(dtype)
    ufunc = {
        ReduceOp.SUM: np.add,
        ReduceOp.PRODUCT: np.multiply,
        ReduceOp.MIN: np.minimum,
        ReduceOp.MAX: np.maximum,
    }[op]
    for x in parts[1:]:
        acc = ufunc(acc, f64(x).astype(dtype))
    return acc.astype(np.float64)


def assert_close(got, want, parts, dtype, op, what):
    got = f64(got)
    if dtype in EPS and op in (ReduceOp.SUM, ReduceOp.AVG):
        p = len(parts)
        scale = np.sum([np.abs(f64(x)) for x in parts], axis=0)
        if op is ReduceOp.AVG:
            scale = scale / p
        bound = (p + 1) * EPS[dtype] * scale + 1e-300
        bad = np.abs(got - want) > bound
        assert not bad.any(), (
            f"{what}: {bad.sum()} elements off by more than the bound; first at "
            f"{np.argmax(bad)}: got {got[bad][0]!r}, want {want[bad][0]!r}"
        )
    else:
        assert np.array_equal(got, want), f"{what}: got {got[:8]}..., want {want[:8]}..."


def same_everywhere(x, what, group=None):
    """Assert every rank of the group holds the same bytes."""
    Digests().add(x, what).check(group or world())


class Digests:
    """Results that must be bitwise the same on every rank, checked together: a case adds one
    digest per call and compares them all in one all-gather at its end (on 8 oversubscribed
    ranks an all-gather per call costs as much as the call checked)."""

    def __init__(self):
        self.whats, self.digests = [], []

    def add(self, x, what: str):
        self.whats.append(what)
        self.digests.append(hashlib.sha1(buffers.as_bytes(x).tobytes()).hexdigest())
        return self

    def check(self, group) -> None:
        if not self.whats:  # a collective with nothing to compare (the same on every rank)
            return
        seen = group.allgather_object(self.digests)
        for what, *digests in zip(self.whats, *seen):
            assert len(set(digests)) == 1, f"{what}: ranks disagree bitwise: {digests}"


def valid_ops(dtype):
    return [op for op in OPS if not (op is ReduceOp.AVG and dtype in ("bool",) + INTS)]


INTS = ("int8", "int32", "int64", "uint8")


def counts(p, kind, dtype, op):
    """Element counts a reducing case calls with: empty, one, fewer than the ranks, odd, and
    1031 (prime: uneven chunks on every world size). Every count with SUM and with each kind's
    first dtype (numpy float64, torch float32) under every op; the other (dtype, op) pairs take
    1031 only: the edge counts are the algorithm's (its chunking), not the op's or the dtype's,
    and an op's or a dtype's arithmetic shows on any count (a third of the calls; every pair
    on every count with MINIPAR_EXTENDED=1)."""
    every = sorted({0, 1, max(p - 1, 1), 7, 1031})
    primary = dtype == ("float64" if kind == "numpy" else "float32")
    return every if primary or op is ReduceOp.SUM or extended() else every[-1:]


def extended() -> bool:
    """MINIPAR_EXTENDED=1: every dtype and every case on every world size."""
    return os.environ.get("MINIPAR_EXTENDED") == "1"


def kinds_dtypes(size):
    """Every dtype on 1, 2 and 4 ranks; on 3 (the odd ring, the remainder of the recursive
    algorithms) and above 4 (oversubscribed, slow) a spread of kinds and widths, unless
    MINIPAR_EXTENDED=1 asks for everything."""
    if size in (1, 2, 4) or extended():
        return [("numpy", d) for d in NUMPY] + [("torch", d) for d in TORCH]
    spread = [("numpy", "float64"), ("torch", "bfloat16"), ("numpy", "int8")]
    if size == 8:
        spread += [("numpy", "bool"), ("torch", "float16"), ("torch", "int32")]
    return spread


# -- cases ----------------------------------------------------------------------------------
def reducing_case(collective, algorithm, kind, dtype):
    def case():
        w = world()
        p, r = w.size, w.rank
        results = Digests()
        for op in valid_ops(dtype):
            for n in counts(p, kind, dtype, op):
                parts = [make(kind, dtype, values(q, n, dtype, op)) for q in range(p)]
                want = reference(parts, dtype, op, kind)
                what = f"{collective}/{algorithm} {kind} {dtype} {op.name} n={n}"
                if collective == "all_reduce":
                    x = make(kind, dtype, values(r, n, dtype, op))
                    minipar.all_reduce(x, op=op, algorithm=algorithm)
                    assert_close(x, want, parts, dtype, op, what)
                    results.add(x, what)
                elif collective == "reduce":
                    for root in sorted({0, p - 1, p // 2}):
                        x = make(kind, dtype, values(r, n, dtype, op))
                        mine = f64(x).copy()
                        minipar.reduce(x, root, op=op, algorithm=algorithm)
                        if r == root:
                            assert_close(x, want, parts, dtype, op, f"{what} root={root}")
                        else:
                            assert np.array_equal(f64(x), mine), f"{what}: non-root changed"
                else:  # reduce_scatter: rank q's input is parts-of-size p*n
                    full = [make(kind, dtype, values(q, p * n, dtype, op, 1)) for q in range(p)]
                    want = reference(full, dtype, op, kind)[r * n : (r + 1) * n]
                    blocks = [f64(x)[r * n : (r + 1) * n] for x in full]
                    out = make(kind, dtype, np.zeros(n))
                    inp = full[r]
                    before = f64(inp).copy()
                    minipar.reduce_scatter_tensor(out, inp, op=op, algorithm=algorithm)
                    assert_close(out, want, blocks, dtype, op, what)
                    assert np.array_equal(f64(inp), before), f"{what}: input changed"
        results.check(w)

    return case


def moving_case(collective, algorithm, kind, dtype):
    """Collectives that move data without reducing: exact equality."""

    def case():
        w = world()
        p, r = w.size, w.rank
        results = Digests()
        for n in [0, 1, 3, 257]:
            mine = make(kind, dtype, values(r, n, dtype, ReduceOp.MIN))
            everyone = [make(kind, dtype, values(q, n, dtype, ReduceOp.MIN)) for q in range(p)]
            what = f"{collective}/{algorithm} {kind} {dtype} n={n}"
            if collective == "all_gather":
                out = make(kind, dtype, np.zeros(p * n))
                minipar.all_gather_into_tensor(out, mine, algorithm=algorithm)
                want = np.concatenate([f64(x) for x in everyone])
                assert np.array_equal(f64(out), want), what
                results.add(out, what)
                outs = [make(kind, dtype, np.zeros(n)) for _ in range(p)]
                minipar.all_gather(outs, mine, algorithm=algorithm)
                for q in range(p):
                    assert np.array_equal(f64(outs[q]), f64(everyone[q])), f"{what} list[{q}]"
            elif collective == "all_to_all":
                inp = make(kind, dtype, values(r, p * n, dtype, ReduceOp.MIN, 2))
                alls = [
                    f64(make(kind, dtype, values(q, p * n, dtype, ReduceOp.MIN, 2)))
                    for q in range(p)
                ]
                out = make(kind, dtype, np.zeros(p * n))
                minipar.all_to_all_single(out, inp, algorithm=algorithm)
                want = np.concatenate([alls[q][r * n : (r + 1) * n] for q in range(p)])
                assert np.array_equal(f64(out), want), what
            else:
                for root in sorted({0, p - 1, p // 2}):
                    rooted(collective, algorithm, kind, dtype, n, root, everyone, what)
        results.check(w)

    return case


def rooted(collective, algorithm, kind, dtype, n, root, everyone, what):
    w = world()
    p, r = w.size, w.rank
    what = f"{what} root={root}"
    if collective == "broadcast":
        x = make(kind, dtype, f64(everyone[r]))
        minipar.broadcast(x, root, algorithm=algorithm)
        assert np.array_equal(f64(x), f64(everyone[root])), what
    elif collective == "scatter":
        out = make(kind, dtype, np.zeros(n))
        pieces = [make(kind, dtype, f64(x)) for x in everyone] if r == root else None
        minipar.scatter(out, pieces, src=root, algorithm=algorithm)
        assert np.array_equal(f64(out), f64(everyone[r])), what
    elif collective == "gather":
        outs = [make(kind, dtype, np.zeros(n)) for _ in range(p)] if r == root else None
        minipar.gather(everyone[r], outs, dst=root, algorithm=algorithm)
        if r == root:
            for q in range(p):
                assert np.array_equal(f64(outs[q]), f64(everyone[q])), f"{what} from {q}"


def large_case(collective, algorithm):
    """At least 4 MiB of float32 through each algorithm (integer values: exact in any order)."""

    def case():
        w = world()
        p, r = w.size, w.rank
        n = (1 << 20) + 3  # 4 MiB + 12 bytes, not divisible by most p
        if collective == "all_reduce":
            x = np.full(n, r + 1, dtype=np.float32)
            x[::2] = -(r + 1)
            minipar.all_reduce(x, algorithm=algorithm)
            t = p * (p + 1) // 2
            assert x[0] == -t and x[1] == t and (np.abs(x) == t).all()
            same_everywhere(x, f"{algorithm} large")
        elif collective == "all_gather":
            block = n // p + 1
            out = np.empty(p * block, dtype=np.float32)
            minipar.all_gather_into_tensor(out, np.full(block, r, np.float32), algorithm=algorithm)
            assert (out.reshape(p, block) == np.arange(p)[:, None]).all()
        elif collective == "reduce_scatter":
            block = n // p + 1
            inp = np.tile(np.arange(p, dtype=np.float32) * (r + 1), (block, 1)).T.ravel()
            out = np.empty(block, dtype=np.float32)
            minipar.reduce_scatter_tensor(out, inp, algorithm=algorithm)
            assert (out == r * p * (p + 1) // 2).all()
        elif collective == "broadcast":
            x = np.arange(n, dtype=np.float32) if r == p - 1 else np.zeros(n, np.float32)
            minipar.broadcast(x, p - 1, algorithm=algorithm)
            assert np.array_equal(x, np.arange(n, dtype=np.float32))

    return case


def left_to_right(algorithm):
    """Linear all-reduce and reduce combine in rank order: bitwise a sequential sum."""

    def case():
        w = world()
        p, r = w.size, w.rank
        parts = [np.random.default_rng(q).standard_normal(999).astype(np.float32) for q in range(p)]
        seq = parts[0].copy()
        for x in parts[1:]:
            seq = seq + x
        x = parts[r].copy()
        minipar.all_reduce(x, algorithm=algorithm)
        assert np.array_equal(x, seq), "linear all-reduce is not the left-to-right sum"

    return case


def sub_groups_case():
    w = world()
    if w.size < 2:
        return
    evens, odds = list(range(0, w.size, 2)), list(range(1, w.size, 2))
    g_even, g_odd = minipar.new_group(evens), minipar.new_group(odds)
    mine = g_even if w.rank % 2 == 0 else g_odd
    members = evens if w.rank % 2 == 0 else odds
    for algorithm in minipar.algorithms("all_reduce")[1:]:
        x = np.full(10, float(w.rank))
        minipar.all_reduce(x, group=mine, algorithm=algorithm)
        assert (x == sum(members)).all(), (algorithm, x)
    # a sub-group's rank numbering: src is a rank *in the group*
    x = np.full(3, float(w.rank))
    minipar.broadcast(x, mine.size - 1, group=mine)
    assert (x == members[-1]).all()


def in_flight_case():
    """Async collectives on two groups and blocking ones on the world, interleaved."""
    w = world()
    p, r = w.size, w.rank
    half = minipar.new_group(list(range(0, p, 2)))
    works, bufs = [], []
    for i in range(4):
        x = np.full(100_000, float(r + i))
        works.append(minipar.all_reduce(x, algorithm="ring", async_op=True))
        bufs.append(x)
        y = np.full(7, float(r))
        minipar.all_reduce(y, algorithm="recursive_doubling")
        assert (y == p * (p - 1) / 2).all()
        if r % 2 == 0:
            z = np.full(5, 1.0)
            minipar.all_reduce(z, group=half, algorithm="tree")
            assert (z == half.size).all()
    for i, (work, x) in enumerate(zip(works, bufs)):
        assert work.wait() is True and work.is_completed()
        assert (x == p * (p - 1) / 2 + p * i).all()


def progress_case():
    """async_op=True makes progress while the caller computes and never polls."""
    import time

    w = world()
    if w.size < 2:
        return
    x = np.ones(1 << 18, dtype=np.float32)
    work = minipar.all_reduce(x, algorithm="ring", async_op=True)
    # 0.25 s on 8 ranks on a quiet 2-core machine; the bound is generous because CI machines are
    # loaded and 8 oversubscribed ranks each share their core with the other's progress threads
    started = time.monotonic()
    while not work.is_completed() and time.monotonic() < started + 30:
        np.sqrt(np.arange(20000.0)).sum()  # the "backward pass": no minipar call in here
    took = time.monotonic() - started
    assert work.is_completed(), f"async all-reduce made no progress in {took:.1f} s of computing"
    work.wait()
    assert (x == w.size).all()


def memory_case():
    """Ring all-reduce allocates one chunk of about n/p elements beyond the buffer."""
    import tracemalloc

    w = world()
    p = w.size
    x = np.ones(1 << 21, dtype=np.float32)  # 8 MiB
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    minipar.all_reduce(x, algorithm="ring")
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    chunk = x.nbytes // p + 4
    assert peak <= chunk + 64 * 1024, f"ring all-reduce peak extra memory {peak} > {chunk} + 64 KiB"
    assert (x == p).all()


def ledger_case(collective, algorithm):
    """The trace ledger's steps and busiest-rank bytes equal minipar.cost.traffic()."""
    from minipar import cost
    from minipar.collectives import hierarchical

    def case():
        w = world()
        p, r = w.size, w.rank
        p2 = 1 << (p.bit_length() - 1)
        for count in (p * p2 * 16, p * p2 * 16 * 3):
            nbytes = count * 4
            if collective == "broadcast" and algorithm == "ring":
                count = (count if count * 4 < cost.SEGMENT_BYTES else 0) + cost.SEGMENT_BYTES
                nbytes = count * 4
            x = np.ones(count, dtype=np.float32)
            n = count // p
            with minipar.trace() as t:
                run_for_ledger(collective, algorithm, x, n, r, p)
            call = t.calls[-1]
            assert call.algorithm == algorithm and len(t.calls) == 1
            steps = max(w.allgather_object(call.steps))
            sent = max(w.allgather_object(call.bytes_sent))
            want = cost.traffic(collective, algorithm, nbytes, p)
            shape = hierarchical.shape(w)  # (nodes, per node) on real (or emulated) nodes
            if algorithm.startswith("hierarchical") and shape:  # both levels: the busiest sum
                inside, between = cost.traffic_on_nodes(collective, algorithm, nbytes, *shape)
                total = inside.bytes_sent + between.bytes_sent
                want = cost.Traffic(inside.steps + between.steps, total, 0)
            what = f"{collective}/{algorithm} p={p} nbytes={nbytes}"
            if algorithm == "hierarchical_pipelined" and shape and min(shape) > 1:
                # C pieces (the cost model's pick) through R = 2 max(N-1, k-1) ring steps a
                # tick: (C + 1) R + 2 (k - 1) steps, C >= 1; hierarchical's bytes exactly
                (nodes_, k), pieces = shape, 0
                ticks = 2 * max(nodes_ - 1, k - 1)
                if (steps - 2 * (k - 1)) % ticks == 0:
                    pieces = (steps - 2 * (k - 1)) // ticks - 1
                assert pieces >= 1, f"{what}: {steps} steps, not (C + 1) {ticks} + {2 * (k - 1)}"
                want = cost.Traffic(steps, want.bytes_sent, 0)
            assert steps == want.steps, f"{what}: {steps} steps, formula says {want.steps}"
            if want.exact:
                assert sent == want.bytes_sent, f"{what}: sent {sent}, formula {want.bytes_sent}"
            else:
                assert sent <= want.bytes_sent, f"{what}: sent {sent} > bound {want.bytes_sent}"

    return case


def run_for_ledger(collective, algorithm, x, n, r, p):
    a = algorithm
    if collective == "all_reduce":
        minipar.all_reduce(x, algorithm=a)
    elif collective == "broadcast":
        minipar.broadcast(x, 0, algorithm=a)
    elif collective == "reduce":
        minipar.reduce(x, 0, algorithm=a)
    elif collective == "all_gather":
        minipar.all_gather_into_tensor(x, x[r * n : (r + 1) * n].copy(), algorithm=a)
    elif collective == "reduce_scatter":
        minipar.reduce_scatter_tensor(np.empty(n, np.float32), x, algorithm=a)
    elif collective == "scatter":
        pieces = [x[q * n : (q + 1) * n] for q in range(p)] if r == 0 else None
        minipar.scatter(np.empty(n, np.float32), pieces, 0, algorithm=a)
    elif collective == "gather":
        outs = [np.empty(n, np.float32) for _ in range(p)] if r == 0 else None
        minipar.gather(x[:n].copy(), outs, 0, algorithm=a)
    elif collective == "all_to_all":
        minipar.all_to_all_single(np.empty_like(x), x, algorithm=a)
    elif collective == "barrier":
        minipar.barrier(algorithm=a)


def barrier_case():
    """Nobody leaves the barrier before the last rank arrives."""
    import time

    w = world()
    stamp = time.time()
    if w.rank == w.size - 1:
        time.sleep(0.3)
        stamp = time.time()
    minipar.barrier()
    left = time.time()
    arrivals = w.allgather_object(stamp)
    assert left >= max(arrivals) - 1e-3, "left the barrier before the last rank arrived"


def thread_level_case():
    """Async collectives run on a progress thread: MPI must provide MPI_THREAD_MULTIPLE."""
    if minipar.get_backend() != "mpi":
        return
    from mpi4py import MPI

    assert MPI.Query_thread() == MPI.THREAD_MULTIPLE, MPI.Query_thread()


def lean_taken_case():
    """Small blocking all-reduces take the lean path (a plan is cached for their shape); async
    calls, traced calls, other algorithms and large buffers take the general one; all agree."""
    from minipar.collectives import registry
    from minipar.collectives.fast import lean

    w = world()
    p, r = w.size, w.rank
    plans = w._lean
    plans.clear()
    x = np.full(2, float(r + 1), dtype=np.float32)
    auto = registry.pick("all_reduce", "auto", x.nbytes, p, w)[0]
    minipar.all_reduce(x)
    want = np.float32(p * (p + 1) / 2)
    assert (x == want).all(), x
    lean_plans = [k for k, plan in plans.items() if plan is not None]
    expected = [(np.dtype(np.float32), 2)] if p == 1 or auto == "recursive_doubling" else []
    assert [k[:2] for k in lean_plans] == expected, (auto, plans)
    minipar.all_reduce(np.ones(3), async_op=True).wait()  # async: never planned
    with minipar.trace():
        minipar.all_reduce(np.ones(5))  # traced: planned maybe, but run on the general path
    minipar.all_reduce(np.ones(7), algorithm="ring")
    big = np.ones(lean.MAX_BYTES // 8 + 1)
    minipar.all_reduce(big, algorithm="recursive_doubling")
    assert (big == p).all()
    shapes = {k[1]: plan for k, plan in plans.items()}
    assert 3 not in shapes and shapes[big.size] is None, plans
    assert (shapes[7] is None) == (p > 1), plans  # on one rank every algorithm is no message


def lean_mixed_case():
    """Rank 0 records a trace (general path) while the others run lean: the same messages meet,
    and every rank's result is bitwise that of an all-general run, signed zeros and NaN too."""
    w = world()
    r = w.rank
    base = np.array([-0.0, 0.0, np.nan, 1.5, -2.25, np.inf], dtype=np.float32)
    for op in (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT, ReduceOp.AVG):
        mine = np.roll(base, r) * np.float32(1 + r)
        mixed, general = mine.copy(), mine.copy()
        if r == 0:
            with minipar.trace():
                minipar.all_reduce(mixed, op=op)
        else:
            minipar.all_reduce(mixed, op=op)
        with minipar.trace():
            minipar.all_reduce(general, op=op)
        assert mixed.tobytes() == general.tobytes(), (op, mixed, general)
        seen = w.allgather_object(mixed.tobytes())
        assert all(b == seen[0] for b in seen), (op, r)


def lean_torch_case():
    """CPU torch tensors (one that requires grad too) on the lean path: the exact ops agree with
    the general path bit for bit; bfloat16 (no numpy twin) goes the general way and is right."""
    w = world()
    p, r = w.size, w.rank
    leaf = torch.full((2, 3), float(r), requires_grad=True)
    minipar.all_reduce(leaf, op=ReduceOp.AVG)
    assert torch.equal(leaf.detach(), torch.full((2, 3), (p - 1) / 2)), leaf
    assert leaf.grad is None and leaf.requires_grad
    ints = torch.arange(4, dtype=torch.int64) + r
    minipar.all_reduce(ints, op=ReduceOp.BXOR)
    want = np.bitwise_xor.reduce([np.arange(4) + q for q in range(p)], axis=0)
    assert (ints.numpy() == want).all(), ints
    half = torch.full((3,), 1.0 + r, dtype=torch.bfloat16)
    minipar.all_reduce(half)
    assert torch.equal(half, torch.full((3,), p * (p + 1) / 2, dtype=torch.bfloat16)), half


REDUCING = ["all_reduce", "reduce", "reduce_scatter"]
MOVING = ["broadcast", "all_gather", "scatter", "gather", "all_to_all"]


def cases(size):
    table = {}
    for collective in REDUCING + MOVING:
        for algorithm in minipar.algorithms(collective)[1:]:
            for kind, dtype in kinds_dtypes(size):
                maker = reducing_case if collective in REDUCING else moving_case
                table[f"{collective}.{algorithm}.{kind}_{dtype}"] = maker(
                    collective, algorithm, kind, dtype
                )
            if collective in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
                table[f"{collective}.{algorithm}.large_4MiB"] = large_case(collective, algorithm)
            table[f"ledger.{collective}.{algorithm}"] = ledger_case(collective, algorithm)
        table[f"{collective}.auto.numpy_float32"] = (
            reducing_case if collective in REDUCING else moving_case
        )(collective, "auto", "numpy", "float32")
    table["ledger.barrier.dissemination"] = ledger_case("barrier", "dissemination")
    table["barrier.dissemination"] = barrier_case
    table["all_reduce.linear.left_to_right"] = left_to_right("linear")
    table["sub_groups"] = sub_groups_case
    table["in_flight"] = in_flight_case
    if size <= 4 or extended():
        # 0.2-0.6 s up to 4 ranks; above, on 2 cores, 1-8 s of GIL hand-overs between each
        # rank's computing thread and its progress thread, whatever the ring's length
        table["async_progress"] = progress_case
    table["ring_memory"] = memory_case
    table["thread_level"] = thread_level_case
    table["lean.taken"] = lean_taken_case
    table["lean.mixed_paths"] = lean_mixed_case
    table["lean.torch"] = lean_torch_case
    import collectives_nodes  # (it imports this file's helpers: imported once this one is loaded)

    table.update(collectives_nodes.cases(size))  # 2 x 2 nodes as a map (4 ranks)
    return table
