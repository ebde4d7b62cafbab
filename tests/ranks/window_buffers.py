"""Buffers that live in the node's shared window (minipar.empty, comm/transport/shm_buffers.py) on
real ranks, and the collectives that read them in place (collectives/fast/in_place.py):

- a buffer from minipar.empty really is in the window: its first byte lies in this rank's
  segment of one of the node's windows, at the same offset on every rank;
- all-reduce, all-gather (of a window output) and reduce-scatter (of a window input), numpy and
  torch, several ops and dtypes, give the bits of the ring over MPI messages (`ring@mpi`), the
  trace names "ring@shm", every message's path "shm-in-place", and the ring's bytes;
- DDP's buckets and FSDP's slots sit in the window, the gradients are views of the buckets, and
  after three optimizer steps the gradients and parameters are bitwise those of the same
  classes on private buffers (the fast paths off: messages over MPI);
- bad use is loud: ranks asking for different sizes get a ValueError on every rank; a twin at
  another offset on one rank is a MismatchError; dropped buffers are freed at a later
  allocation; with the fast paths off, or one rank, the buffer is private.
"""

import gc

import numpy as np
import torch
from torch import nn

import minipar
from minipar.comm.transport import shm_buffers
from minipar.errors import MismatchError
from minipar.parallel import DistributedDataParallel, FullyShardedDataParallel

N = 3 * (1 << 16) + 5  # float32 elements: above 64 KiB, several blocks, not a multiple of p


def world():
    return minipar.init()


def data(n, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 4, n).astype(dtype)
    x = rng.standard_normal(n).astype(dtype)
    x[::7], x[1::11] = 0.0, -0.0  # MIN and MAX of signed zeros depend on the order
    return x


def same_bits(a, b, what):
    a = a.numpy() if torch.is_tensor(a) else a
    b = b.numpy() if torch.is_tensor(b) else b
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert a.tobytes() == b.tobytes(), f"{what}: the in-place path changed the bits"


def segment_of(buf):
    """(window serial, offset) of buf's first byte in this rank's segments, checked by hand."""
    node = world()._shm_node
    start = shm_buffers.address(buf)
    for window in node.buffers:
        mine = window.segments[world().rank]
        lo = mine.__array_interface__["data"][0]
        if lo <= start < lo + mine.nbytes:
            return window.serial, start - lo
    return None


def lies_in_the_window():
    w = world()
    x = minipar.empty((N,), torch.float32)
    y = minipar.empty(N, np.float64)
    for buf, what in ((x, "torch"), (y, "numpy")):
        place = segment_of(buf)
        assert place is not None, f"a {what} buffer from minipar.empty is not in the window"
        assert minipar.collectives.in_window(buf)
        seen = w.allgather_object(place)
        assert all(s == seen[0] for s in seen), f"{what}: twins at different places: {seen}"
    assert not minipar.collectives.in_window(torch.empty(N))


def in_place_all_reduce():
    w = world()
    p, r = w.size, w.rank
    for kind in ("numpy", "torch"):
        for dtype, ops in ((np.float32, ("sum", "min", "max", "product", "avg")),
                           (np.float64, ("sum",)), (np.int32, ("sum", "bxor"))):  # fmt: skip
            for op in ops:
                want = data(N, dtype, 5 * r + 1)
                if kind == "numpy":
                    x = minipar.empty(N, dtype)
                    x[:] = want
                else:
                    x = minipar.empty((N,), torch.from_numpy(want).dtype)
                    x.copy_(torch.from_numpy(want))
                minipar.all_reduce(want, op=op, algorithm="ring@mpi")
                with minipar.trace() as t:
                    minipar.all_reduce(x, op=op)
                what = f"all_reduce {kind} {np.dtype(dtype)} {op} on {p} ranks"
                same_bits(x, want, what)
                assert t.algorithms == ["ring@shm"], f"{what}: ran {t.algorithms}"
                assert set(t.paths()) == {"shm-in-place"}, f"{what}: paths {t.paths()}"
                ring = 2 * (p - 1) * want.nbytes / p  # the ring's bytes, to an element a chunk
                assert abs(t.bytes_sent() - ring) <= p * want.itemsize, (what, t.bytes_sent())
                assert t.bytes_received() == t.bytes_sent(), what


def in_place_all_gather():
    w = world()
    p, r = w.size, w.rank
    m = N // p
    inp = data(m, np.float32, r + 11)
    want = np.empty(p * m, np.float32)
    minipar.all_gather_into_tensor(want, inp, algorithm="ring@mpi")
    out = minipar.empty(p * m, np.float32)
    with minipar.trace() as t:
        minipar.all_gather_into_tensor(out, inp)
    same_bits(out, want, "all_gather")
    assert t.algorithms == ["ring@shm"] and set(t.paths()) == {"shm-in-place"}, t.paths()
    assert t.bytes_sent() == (p - 1) * m * 4
    again = minipar.empty((p * m,), torch.float32)  # the in-place form: my block is the input
    again[r * m : (r + 1) * m] = torch.from_numpy(inp)
    minipar.all_gather_into_tensor(again, again[r * m : (r + 1) * m])
    same_bits(again, want, "all_gather in place")


def in_place_reduce_scatter():
    w = world()
    p, r = w.size, w.rank
    m = N // p
    for op in ("sum", "min", "max", "avg"):
        big = data(p * m, np.float32, 3 * r + 2)
        want = np.empty(m, np.float32)
        minipar.reduce_scatter_tensor(want, big, op=op, algorithm="ring@mpi")
        inp = minipar.empty(p * m, np.float32)
        inp[:] = big
        out = np.empty(m, np.float32)
        with minipar.trace() as t:
            minipar.reduce_scatter_tensor(out, inp, op=op)
        same_bits(out, want, f"reduce_scatter {op}")
        assert t.algorithms == ["ring@shm"] and set(t.paths()) == {"shm-in-place"}
        assert t.bytes_sent() == (p - 1) * m * 4
        inp[:] = big  # the in-place form: the output is my block of the input
        minipar.reduce_scatter_tensor(inp[r * m : (r + 1) * m], inp, op=op)
        same_bits(inp[r * m : (r + 1) * m], want, f"reduce_scatter {op} in place")


def build(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(48, 320), nn.ReLU(), nn.Linear(320, 320), nn.Tanh(), nn.Linear(320, 6)
    )


def train(make, fast: bool, steps=3):
    """(gradients after each step, parameters after the last, the wrapper, the trace)."""
    w = world()
    minipar.init(fast_paths=fast)
    try:
        model = make()
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        g = torch.Generator().manual_seed(100 + w.rank)
        grads = []
        with minipar.trace() as t:
            for _ in range(steps):
                opt.zero_grad()
                out = model(torch.randn(8, 48, generator=g))
                out.float().square().mean().backward()
                grads.append([p.grad.clone() for p in model.parameters()])
                opt.step()
        return grads, [p.detach().clone() for p in model.parameters()], model, t
    finally:
        minipar.init(fast_paths=True)


def compare(on, off, what):
    for step, (a, b) in enumerate(zip(on[0], off[0])):
        for i, (ga, gb) in enumerate(zip(a, b)):
            same_bits(ga, gb, f"{what}: gradient {i} after step {step}")
    for i, (pa, pb) in enumerate(zip(on[1], off[1])):
        same_bits(pa, pb, f"{what}: parameter {i}")


def ddp_window_vs_private():
    for cap in (25, 0.5):
        make = lambda cap=cap: DistributedDataParallel(build(), bucket_cap_mb=cap)  # noqa: E731
        on, off = train(make, True), train(make, False)
        compare(on, off, f"DDP cap={cap}")
        ddp, t = on[2], on[3]
        big = [b for b in ddp.buckets if b.numel * 4 > 64 << 10]
        assert big, "no bucket above 64 KiB: nothing to read in place"
        for b in big:
            assert segment_of(b.buffer) is not None, "a DDP bucket is not in the window"
        assert not any(minipar.collectives.in_window(b.buffer) for b in off[2].buckets)
        for b in ddp.buckets:
            for p, view in zip(b.params, b.views):
                assert p.grad.data_ptr() == view.data_ptr(), "a gradient is not its bucket's view"
        assert t.paths().get("shm-in-place"), f"DDP cap={cap}: no message read in place"
        assert "shm-in-place" not in off[3].paths(), "with the fast paths off: read in place"


def fsdp_window_vs_private():
    for dtype in (None, torch.bfloat16):
        make = lambda dtype=dtype: FullyShardedDataParallel(build(), compute_dtype=dtype)  # noqa: E731
        on, off = train(make, True), train(make, False)
        compare(on, off, f"FSDP {dtype}")
        fsdp, t = on[2], on[3]
        assert len(fsdp.slots.slots) == 2 and not off[2].slots.slots
        for slot in fsdp.slots.slots:
            assert segment_of(slot) is not None, "an FSDP slot is not in the window"
        windowed = [c for c in t.calls if c.algorithm == "ring@shm"]
        assert {c.collective for c in windowed} == {"all_gather", "reduce_scatter"}, windowed
        for c in windowed:
            assert {m.path for m in c.messages} == {"shm-in-place"}, c
        full_on, full_off = on[2].gather_full_params(), off[2].gather_full_params()
        for name in full_on:
            same_bits(full_on[name], full_off[name], f"FSDP {dtype} {name}")


def different_sizes_refused():
    w = world()
    try:
        minipar.empty(1000 + (w.rank == w.size - 1), np.float32)
    except ValueError as error:
        text = str(error)
        assert "different sizes" in text and f"rank {w.size - 1}: 4004 bytes" in text, text
    else:
        raise AssertionError("buffers of different sizes were accepted")
    try:
        minipar.empty((-1, 3), np.float32)
    except ValueError as error:
        assert "(-1, 3)" in str(error)
    else:
        raise AssertionError("a negative shape was accepted")


def twin_elsewhere_is_a_mismatch():
    """Rank 0 reduces the second half of its buffer, the others the first: MismatchError."""
    w = world()
    g = minipar.new_group(list(range(w.size)), timeout=5)
    x = minipar.empty(2 * N, np.float32, group=g)
    x[:] = 1
    half = x[N:] if w.rank == 0 else x[:N]
    try:
        minipar.all_reduce(half, group=g)
    except MismatchError as error:
        assert "window buffer" in str(error), error
    else:
        raise AssertionError("twins at different offsets were reduced together")


def dropped_buffers_are_freed():
    w = world()
    minipar.empty(4, np.float32)  # the node's windows exist
    node = w._shm_node
    before = len(node.buffers)
    for _ in range(5):
        x = minipar.empty(1 << 18, np.float32)
        del x
    gc.collect()
    keep = minipar.empty(1 << 18, np.float32)
    assert len(node.buffers) <= before + 1, (before, len(node.buffers))
    keep[:] = 1
    minipar.all_reduce(keep)
    assert (keep == w.size).all()


def private_when_off():
    minipar.init(fast_paths=False)
    try:
        x = minipar.empty((N,), torch.float32)
        assert not minipar.collectives.in_window(x)
        x.fill_(1.0)
        minipar.all_reduce(x)
        assert (x == world().size).all()
    finally:
        minipar.init(fast_paths=True)


def cases(size):
    if size == 1:
        return {"private_when_off": private_when_off}
    return {
        "lies_in_the_window": lies_in_the_window,
        "all_reduce": in_place_all_reduce,
        "all_gather": in_place_all_gather,
        "reduce_scatter": in_place_reduce_scatter,
        "ddp_window_vs_private": ddp_window_vs_private,
        "fsdp_window_vs_private": fsdp_window_vs_private,
        "different_sizes_refused": different_sizes_refused,
        "twin_elsewhere_is_a_mismatch": twin_elsewhere_is_a_mismatch,
        "dropped_buffers_are_freed": dropped_buffers_are_freed,
        "private_when_off": private_when_off,
    }
