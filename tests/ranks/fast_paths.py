"""The fast paths' switch (minipar/collectives/fast/) on real ranks: every collective that has a
fast path gives the same bits with the fast paths on and off, and each fast path is really taken
when on and really not when off (else the comparison would prove nothing).

- lean (small blocking all-reduces): every op, numpy and CPU torch, several dtypes and sizes;
  on, a plan is cached for the shape; off, none is;
- direct steps (numpy buffers over MPI): every collective and every built-in algorithm; the
  steps that took fast/direct.py's exchange are counted: none with it off, and with it on some
  for every collective (its send / recv / sendrecv steps; posted isends take the plain path);
- the windows (the ring's all-reduce, all-gather and reduce-scatter inside a node, when the cost
  model prices them cheaper): with a window link that always wins, the trace shows "ring@shm"
  on and "ring" off, and the bits agree, for SUM, MIN, MAX and PRODUCT with signed zeros;
- pieces (a ring all-reduce of a numpy buffer over MPI whose chunks span more than one piece:
  fast/pieces.py): the same bits on and off for every op with signed zeros, on uneven chunks
  and a short last piece; taken on, not off, not with a trace open, not in the student edition;
- scratch sums (the same ring whose chunks fit in cache: fast/scratch_sums.py): the same checks,
  and not taken where its chunks are out of its range;
- in place (a buffer from minipar.empty, which lives in the window): `auto` runs the ring either
  way; on, the trace shows "ring@shm" and every message read in place ("shm-in-place"), off,
  "ring" over MPI messages, and the bits agree, for the same ops.
Inputs are random floats (so a different order of operations shows in the last bits), with
+0.0 and -0.0 sprinkled in (MIN and MAX of the two depend on the operands' order).
"""

import contextlib
import os
import tempfile
from functools import partial

import numpy as np
import torch

import minipar
from minipar import cost
from minipar.collectives import call as call_module
from minipar.collectives import registry
from minipar.collectives.fast import lean, pieces, scratch_sums
from minipar.collectives.reduce_op import as_op
from minipar.state import process

FAST_OPS = ["sum", "product", "min", "max", "avg"]


def world():
    return minipar.init()


@contextlib.contextmanager
def fast_paths(on: bool):
    """Every rank turns the switch the same way (init(fast_paths=...) on a running world)."""
    minipar.init(fast_paths=on)
    try:
        yield
    finally:
        minipar.init(fast_paths=True)


def same_bits(a, b, what):
    a = a.numpy() if isinstance(a, torch.Tensor) else a
    b = b.numpy() if isinstance(b, torch.Tensor) else b
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert a.tobytes() == b.tobytes(), f"{what}: the fast path changed the bits"


def data(n, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iub":
        return rng.integers(0, 5, n).astype(dtype)
    x = rng.standard_normal(n).astype(dtype)
    x[::7], x[1::11] = 0.0, -0.0
    return x


def both_ways(run, make):
    """(result with the fast paths on, result with them off) of run(buffer) on fresh copies."""
    results = []
    for on in (True, False):
        x = make()
        with fast_paths(on):
            results.append(run(x))
    return results


def lean_case():
    w = world()
    for kind in ("numpy", "torch"):
        for dtype in (np.float32, np.float64, np.int32):
            for n in (1, 3, 1000):
                for op in FAST_OPS + (["band", "bxor"] if dtype == np.int32 else []):
                    if op == "avg" and dtype == np.int32:
                        continue

                    def make(dtype=dtype, n=n, kind=kind):
                        x = data(n, dtype, w.rank + 17)
                        return torch.from_numpy(x) if kind == "torch" else x

                    def run(x, op=op):
                        w._lean.clear()
                        minipar.all_reduce(x, op=op)
                        planned = [k for k, plan in w._lean.items() if plan is not None]
                        return x, planned

                    (on, planned_on), (off, planned_off) = both_ways(run, make)
                    what = f"lean all_reduce {kind} {np.dtype(dtype)} n={n} {op}"
                    same_bits(on, off, what)
                    auto = registry.pick("all_reduce", "auto", on.nbytes, w.size)[0]
                    exact = kind == "numpy" or as_op(op) in lean.EXACT_OPS  # torch: exact ops
                    if exact and (auto == "recursive_doubling" or w.size == 1):
                        assert planned_on, f"{what}: the lean path was not taken with it on"
                    assert not planned_off, f"{what}: the lean path was taken with it off"


def _calls(collective, p, r, n):
    """(algorithm, function of a fresh input returning the output) for each built-in."""
    root = p - 1
    table = {
        "all_reduce": lambda alg: lambda x: (minipar.all_reduce(x, algorithm=alg), x)[1],
        "broadcast": lambda alg: lambda x: (minipar.broadcast(x, src=root, algorithm=alg), x)[1],
        "reduce": lambda alg: lambda x: (minipar.reduce(x, dst=root, algorithm=alg), x)[1],
        "all_gather": lambda alg: lambda x: _gather_all(x, p, alg),
        "reduce_scatter": lambda alg: lambda x: _reduce_scatter(x, p, alg),
        "scatter": lambda alg: lambda x: _scatter(x, p, r, root, alg),
        "gather": lambda alg: lambda x: _gather(x, p, r, root, alg),
        "all_to_all": lambda alg: lambda x: _all_to_all(x, alg),
    }
    return [(alg, table[collective](alg)) for alg in sorted(registry.BUILTIN[collective])]


def _gather_all(x, p, alg):
    out = np.empty(p * len(x), x.dtype)
    minipar.all_gather_into_tensor(out, x, algorithm=alg)
    return out


def _reduce_scatter(x, p, alg):
    out = np.empty(len(x) // p, x.dtype)
    minipar.reduce_scatter_tensor(out, x, algorithm=alg)
    return out


def _scatter(x, p, r, root, alg):
    out = np.empty(len(x) // p, x.dtype)
    pieces = list(x.reshape(p, -1)) if r == root else None
    minipar.scatter(out, pieces, src=root, algorithm=alg)
    return out


def _gather(x, p, r, root, alg):
    pieces = [np.empty_like(x) for _ in range(p)] if r == root else None
    minipar.gather(x, pieces, dst=root, algorithm=alg)
    return np.concatenate(pieces) if pieces else x


def _all_to_all(x, alg):
    out = np.empty_like(x)
    minipar.all_to_all_single(out, x, algorithm=alg)
    return out


@contextlib.contextmanager
def counting(module, name: str):
    """Count the calls of module.name while the block runs (the code under test calls it by
    that name: call.py the exchange, routing.py the ring's fast forms)."""
    counted, real = [0], getattr(module, name)

    def counter(*args, **kwargs):
        counted[0] += 1
        return real(*args, **kwargs)

    setattr(module, name, counter)
    try:
        yield counted
    finally:
        setattr(module, name, real)


def counting_direct_steps():
    """Count the steps that take fast/direct.py's exchange."""
    return counting(call_module, "exchange")


def direct_case():
    w = world()
    p, r = w.size, w.rank
    n = 12 * p * 1400  # divides by p; above the lean path's 64 KiB, which would take all_reduce
    for collective in registry.ALGORITHMS:
        if collective == "barrier":
            continue
        direct_somewhere = 0
        for alg, run in _calls(collective, p, r, n):
            counts = []
            for on in (True, False):
                with fast_paths(on), counting_direct_steps() as counted:
                    x = data(n, np.float32, 31 * r + 5)
                    counts.append((run(x), counted[0]))
            (on_out, on_steps), (off_out, off_steps) = counts
            what = f"{collective} {alg} on {p} ranks"
            same_bits(on_out, off_out, what)
            direct_somewhere += sum(w.allgather_object(on_steps))  # a root may only isend
            assert off_steps == 0, f"{what}: {off_steps} steps took the direct path with it off"
        if p > 1:  # (algorithms that post isend/irecv and wait, like linear, never take it)
            assert direct_somewhere, f"{collective}: no algorithm took the direct path with it on"


def torch_view_case():
    """An all-reduce of a CPU torch tensor runs on its memory as numpy (the direct steps), on
    the caller's thread or the progress thread, for the ops whose kernels agree, with the same
    bits as torch's path; not for MIN and MAX, not under a trace."""
    w = world()
    p, r = w.size, w.rank
    n = 3 * p * 1000 + 1  # uneven chunks (the ring: the lean path runs recursive doubling only)
    cases = [(torch.float32, ["sum", "avg", "product"]), (torch.float64, ["sum"]),
             (torch.int64, ["sum", "bxor"]), (torch.float32, ["min", "max"])]  # fmt: skip
    for dtype, ops in cases:
        for op in ops:
            got = []
            for on in (True, False):
                with fast_paths(on), counting_direct_steps() as counted:
                    x = torch.from_numpy(data(n, torch.empty(0, dtype=dtype).numpy().dtype,
                                              7 * r + 3))  # fmt: skip
                    minipar.all_reduce(x, op=op, algorithm="ring")
                    got.append((x, counted[0]))
            (on_out, on_steps), (off_out, off_steps) = got
            what = f"torch {dtype} {op} ring all_reduce on {p} ranks"
            same_bits(on_out, off_out, what)
            exact = op not in ("min", "max")
            assert off_steps == 0 and (on_steps > 0) == (exact and p > 1), (what, on_steps)
    x = torch.ones(n)
    with counting_direct_steps() as counted:
        minipar.all_reduce(x, algorithm="ring", async_op=True).wait()
    assert counted[0] == 2 * (p - 1), f"async: {counted[0]} direct steps, not the ring's"
    with counting_direct_steps() as counted, minipar.trace():
        minipar.all_reduce(x, algorithm="ring")
    assert counted[0] == 0, f"{counted[0]} direct steps under a trace"
    assert torch.equal(x, torch.full((n,), float(p * p))), "the two calls' sums are wrong"


@contextlib.contextmanager
def windows_always_win():
    """A window link that beats any MPI algorithm, named by MINIPAR_SHM_LINK as `minipar bench
    --fit` would (the same file on every rank: rank 0 writes it, the path is all-gathered)."""
    w = world()
    folder = tempfile.mkdtemp(prefix="minipar-fast-") if w.rank == 0 else None
    folder = w.allgather_object(folder)[0]
    path = os.path.join(folder, "shm-link.json")
    if w.rank == 0:
        link = cost.Link("always-wins", alpha=1e-12, beta=1e-15, gamma=1e-15, source="test")
        cost.save_link(link, path)
    w.barrier()
    saved_env, saved_link = os.environ.get(cost.SHM_LINK_ENV), process.links.pop("shm", None)
    os.environ[cost.SHM_LINK_ENV] = path
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop(cost.SHM_LINK_ENV)
        else:
            os.environ[cost.SHM_LINK_ENV] = saved_env
        process.links.pop("shm", None)
        if saved_link is not None:
            process.links["shm"] = saved_link
        w.barrier()
        if w.rank == 0:
            os.remove(path)
            os.rmdir(folder)


def windows_case():
    w = world()
    p, r = w.size, w.rank
    n = p * (cost.SHM_MIN_BYTES // 4 + 3)  # above the windows' smallest size, in float32
    runs = {
        "all_reduce": lambda x, op: (minipar.all_reduce(x, op=op, algorithm="ring"), x)[1],
        "all_gather": lambda x, op: _gather_all(x[: n // p], p, "ring"),
        "reduce_scatter": lambda x, op: _reduce_scatter_op(x, p, op),
    }
    with windows_always_win():
        for collective, run in runs.items():
            for op in ("sum", "min", "max", "product"):
                got = []
                for on in (True, False):
                    with fast_paths(on), minipar.trace() as t:
                        got.append((run(data(n, np.float32, 7 * r + 1), op), t.algorithms))
                (on_out, on_algs), (off_out, off_algs) = got
                what = f"{collective} {op} on {p} ranks"
                if p > 1:
                    assert on_algs == ["ring@shm"], f"{what}: with it on, ran {on_algs}"
                assert off_algs == ["ring"], f"{what}: with it off, ran {off_algs}"
                same_bits(on_out, off_out, what)


@contextlib.contextmanager
def counting_pieced_rings(piece_bytes: int):
    """Count the ring all-reduces that ran on fast/pieces.py, its pieces shrunk to piece_bytes so
    that a small buffer spans many of them."""
    size, pieces.PIECE_BYTES = pieces.PIECE_BYTES, piece_bytes
    try:
        with counting(pieces, "all_reduce_ring_pieces") as counted:
            yield counted
    finally:
        pieces.PIECE_BYTES = size


def ring_on_and_off(counter, n: int, seed: int, cases):
    """(dtype, op, result on, result off, runs counted on, runs counted off) of a ring all-reduce
    of n elements, the fast paths on then off, for each (dtype, ops) in cases; `counter()`
    counts the fast form's runs."""
    for dtype, ops in cases:
        for op in ops:
            got = []
            for on in (True, False):
                with fast_paths(on), counter() as counted:
                    x = data(n, dtype, seed)
                    minipar.all_reduce(x, op=op, algorithm="ring")
                    got.append((x, counted[0]))
            (on_out, on_count), (off_out, off_count) = got
            yield dtype, op, on_out, off_out, on_count, off_count


def ring_not_taken(counter, n: int, seed: int, counts=()) -> int:
    """How many times the fast form `counter()` counts ran for a ring all-reduce of n elements
    under a trace (which records the ring's own messages), in the student edition (the
    student's ring runs), and of each element count in `counts`."""
    with counter() as counted:
        with minipar.trace():
            minipar.all_reduce(data(n, np.float32, seed), algorithm="ring")
        real = pieces.ring_is_minipars
        pieces.ring_is_minipars = lambda: False
        try:
            minipar.all_reduce(data(n, np.float32, seed), algorithm="ring")
        finally:
            pieces.ring_is_minipars = real
        for count in counts:
            minipar.all_reduce(data(count, np.float32, seed), algorithm="ring")
    return counted[0]


def pieces_case():
    w = world()
    p, r = w.size, w.rank
    n = p * (cost.SHM_MIN_BYTES // 4 + 3) + 1  # uneven chunks, above the windows' smallest size
    piece = 4 * 1000  # 1000 elements of float32: a chunk's last piece is short
    cases = ((np.float32, FAST_OPS), (np.float64, ["sum", "min"]), (np.int32, ["sum"]))
    for dtype, ops in cases:
        counter = partial(counting_pieced_rings, piece * np.dtype(dtype).itemsize // 4)
        runs = ring_on_and_off(counter, n, 11 * r + 2, [(dtype, ops)])
        for _, op, on_out, off_out, on_count, off_count in runs:
            what = f"pieced ring all_reduce {np.dtype(dtype)} {op} on {p} ranks"
            same_bits(on_out, off_out, what)
            same_bits(on_out, w.allgather_object(on_out)[0], f"{what}: rank 0's bits")
            assert on_count == (p > 1) and off_count == 0, (what, on_count, off_count)
    ran = ring_not_taken(partial(counting_pieced_rings, piece), n, r)
    assert ran == 0, f"the pieced ring ran {ran} times under a trace or a hand-out"


def scratch_sums_case():
    w = world()
    p, r = w.size, w.rank
    n = p * (cost.SHM_MIN_BYTES // 4 + 3) + 1  # uneven chunks, above the routed smallest size
    counter = partial(counting, scratch_sums, "all_reduce_ring_scratch")
    cases = ((np.float32, FAST_OPS), (np.float64, ["sum", "min"]), (np.int32, ["sum"]))
    runs = ring_on_and_off(counter, n, 13 * r + 5, cases)
    for dtype, op, on_out, off_out, on_count, off_count in runs:
        what = f"scratch-sums ring all_reduce {np.dtype(dtype)} {op} on {p} ranks"
        expected = _reference(n, dtype, op, p, lambda q: 13 * q + 5)
        close = np.allclose(on_out, expected, rtol=1e-5, atol=1e-5)
        assert close, f"{what}: not the reduction of the inputs"
        same_bits(on_out, off_out, what)
        same_bits(on_out, w.allgather_object(on_out)[0], f"{what}: rank 0's bits")
        assert on_count == (p > 1) and off_count == 0, (what, on_count, off_count)
    small = cost.SHM_MIN_BYTES // 4 - 1  # under the smallest size routing considers
    large = p * (scratch_sums.CACHED_BYTES // 4 + 1)  # over it
    ran = ring_not_taken(counter, n, r, (small, large))
    assert ran == 0, f"the scratch-sums ring ran {ran} times out of its place"


def _reference(n, dtype, op, p, seed_of):
    """The reduction of every rank's input, computed here from the seeds (numpy, in float64)."""
    inputs = np.stack([data(n, dtype, seed_of(q)).astype(np.float64) for q in range(p)])
    name = "sum" if op == "avg" else op
    out = {"sum": inputs.sum(0), "product": inputs.prod(0), "min": inputs.min(0),
           "max": inputs.max(0)}[name]  # fmt: skip
    return out / p if op == "avg" else out


def in_place_case():
    w = world()
    p, r = w.size, w.rank
    n = p * (cost.SHM_MIN_BYTES // 4 + 3)
    x, out, big = (minipar.empty(k, np.float32) for k in (n, n, n))  # allocated with it on
    runs = {
        "all_reduce": lambda v, op: (minipar.all_reduce(_fill(x, v), op=op), x)[1],
        "all_gather": lambda v, op: (minipar.all_gather_into_tensor(out, v[: n // p]), out)[1],
        "reduce_scatter": lambda v, op: _reduce_scatter_into(_fill(big, v), p, op),
    }
    for collective, run in runs.items():
        for op in ("sum", "min", "max", "product"):
            got = []
            for on in (True, False):
                with fast_paths(on), minipar.trace() as t:
                    result = run(data(n, np.float32, 5 * r + 3), op).copy()
                got.append((result, t.algorithms, set(t.paths())))
            (on_out, on_algs, on_paths), (off_out, off_algs, off_paths) = got
            what = f"in place {collective} {op} on {p} ranks"
            if p > 1:
                assert on_algs == ["ring@shm"] and on_paths == {"shm-in-place"}, (what, on_paths)
                assert off_algs == ["ring"] and "shm-in-place" not in off_paths, (what, off_algs)
            same_bits(on_out, off_out, what)


def _fill(buf, values):
    buf[:] = values
    return buf


def _reduce_scatter_into(inp, p, op):
    out = np.empty(len(inp) // p, inp.dtype)
    minipar.reduce_scatter_tensor(out, inp, op=op)
    return out


def _reduce_scatter_op(x, p, op):
    out = np.empty(len(x) // p, x.dtype)
    minipar.reduce_scatter_tensor(out, x, op=op, algorithm="ring")
    return out


def switch_case():
    """init(fast_paths=) sets the switch every call reads, and init() alone keeps it."""
    minipar.init(fast_paths=False)
    try:
        assert process.fast_paths is False
        minipar.init()
        assert process.fast_paths is False, "init() without the argument changed the switch"
    finally:
        minipar.init(fast_paths=True)
    assert process.fast_paths is True


def cases(size):
    return {
        "lean": lean_case,
        "direct_steps": direct_case,
        "windows": windows_case,
        "pieces": pieces_case,
        "scratch_sums": scratch_sums_case,
        "torch_view": torch_view_case,
        "in_place": in_place_case,
        "switch": switch_case,
    }
