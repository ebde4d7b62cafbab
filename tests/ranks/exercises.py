"""The exercises' multi-rank tests (run on every rank by minipar.testing): one suite grades either
tree. MINIPAR_EXERCISES_IMPL names the folder whose exN_*.py files are tested (default: the
repository's solutions/); `pytest --impl=exercises` and `minipar grade` set it.

Case names start with the exercise's file name, so `minipar grade 03` can select them. Every case
calls the student's function before it asserts anything, so an untouched exercise fails with
its NotImplementedError and nothing else.
"""

import os

import numpy as np
from exercises_ex05 import ex05_cases

import minipar
from minipar import cost, exercises
from minipar.collectives.call import Call

IMPL = os.environ.get("MINIPAR_EXERCISES_IMPL", "solutions")


def student(module: str, function: str):
    return getattr(exercises.load(module, IMPL), function)


def world():
    return minipar.init()


def gather(obj):
    return world().allgather_object(obj)


# -- ex02: ring shift ------------------------------------------------------------------------------


def ring_shift_case(shift: int, count: int):
    def case():
        w = world()
        ring_shift = student("ex02_ring_shift", "ring_shift")
        x = np.arange(count, dtype=np.float64) + 1000 * w.rank
        out = np.full(count, -1.0)
        with minipar.trace() as t:
            ring_shift(Call(w, "ring_shift", "student"), x, out, shift)
        src = (w.rank - shift) % w.size
        want = np.arange(count, dtype=np.float64) + 1000 * src
        assert np.array_equal(out, want), f"rank {w.rank} got {out[:4]}..., want {want[:4]}..."
        assert np.array_equal(x, np.arange(count) + 1000 * w.rank), "x was modified"
        assert t.bytes_sent() == x.nbytes, f"sent {t.bytes_sent()} bytes, expected {x.nbytes}"

    return case


# -- ex02: broadcasts ------------------------------------------------------------------------------


def broadcast_every_root(module: str, function: str):
    def case():
        w = world()
        fn = student(module, function)
        for root in range(w.size):
            x = np.arange(37, dtype=np.float32) + (100 * w.rank if w.rank != root else 7)
            minipar.broadcast(x, src=root, algorithm=fn)
            want = np.arange(37, dtype=np.float32) + 7
            assert np.array_equal(x, want), f"root {root}: rank {w.rank} has {x[:3]}..."

    return case


def broadcast_linear_ledger():
    def case():
        w = world()
        fn = student("ex02_broadcast_linear", "broadcast_linear")
        x = np.ones(1000, np.float64)
        root = w.size - 1
        with minipar.trace() as t:
            minipar.broadcast(x, src=root, algorithm=fn)
        sent, received = t.bytes_sent(), t.bytes_received()
        if w.rank == root:
            want = (w.size - 1) * x.nbytes
            assert sent == want, f"the root sent {sent} bytes; a linear broadcast sends {want}"
        else:
            assert (sent, received) == (0, x.nbytes), (
                f"rank {w.rank} sent {sent} and received {received} bytes; expected 0 and "
                f"{x.nbytes}: only the root sends"
            )

    return case


def broadcast_binomial_ledger():
    def case():
        w = world()
        fn = student("ex02_broadcast_binomial", "broadcast_binomial")
        x = np.ones(1000, np.float64)
        with minipar.trace() as t:
            minipar.broadcast(x, src=0, algorithm=fn)
        sends = [m.step for m in t.messages if m.kind == "send"]
        everyone = gather((t.steps, t.bytes_sent(), sends))
        want = cost.traffic("broadcast", "tree", x.nbytes, w.size)
        steps = max(s for s, _, _ in everyone)
        assert steps == want.steps, f"took {steps} steps; a binomial tree takes {want.steps}"
        busiest = max(b for _, b, _ in everyone)
        assert busiest == want.bytes_sent, (
            f"the busiest rank sent {busiest}, want {want.bytes_sent}"
        )
        for rank, (_, _, steps_of_sends) in enumerate(everyone):
            assert len(steps_of_sends) == len(set(steps_of_sends)), (
                f"rank {rank} sent twice in one step ({steps_of_sends}): number the steps with "
                "call.rounds(), one message per rank per step"
            )
        total = sum(len(s) for _, _, s in everyone)
        assert total == w.size - 1, f"{total} messages in all; a broadcast tree needs p-1"

    return case


# -- ex03: all-reduces -----------------------------------------------------------------------------


def all_reduce_values(module: str, function: str):
    """Sums against numpy, for counts that divide evenly, unevenly, and fewer than p."""

    def case():
        w = world()
        fn = student(module, function)
        for count in (4 * w.size, 4 * w.size + 3, max(w.size - 1, 1), 1000):
            x = np.arange(count, dtype=np.float64) * (w.rank + 1)
            minipar.all_reduce(x, algorithm=fn)
            want = np.arange(count, dtype=np.float64) * sum(range(1, w.size + 1))
            assert np.array_equal(x, want), f"count {count}: rank {w.rank} has {x[:4]}..."

    return case


def all_reduce_ops(module: str, function: str):
    def case():
        w = world()
        fn = student(module, function)
        for op, reference in ((minipar.ReduceOp.MAX, np.max), (minipar.ReduceOp.PRODUCT, np.prod)):
            inputs = [np.arange(1, 11, dtype=np.int64) % (r + 2) + 1 for r in range(w.size)]
            x = inputs[w.rank].copy()
            minipar.all_reduce(x, op=op, algorithm=fn)
            want = reference(np.stack(inputs), axis=0)
            assert np.array_equal(x, want), f"{op}: rank {w.rank} has {x}, want {want}"

    return case


def all_reduce_bitwise(module: str, function: str):
    """float32 random data: every rank must end with exactly the same bits."""

    def case():
        w = world()
        fn = student(module, function)
        x = np.random.default_rng(w.rank).standard_normal(4099).astype(np.float32)
        inputs = [
            np.random.default_rng(r).standard_normal(4099).astype(np.float32) for r in range(w.size)
        ]
        minipar.all_reduce(x, algorithm=fn)
        exact = np.sum(np.stack(inputs).astype(np.float64), axis=0)
        assert np.allclose(x, exact, rtol=1e-5, atol=1e-5), "not the sum"
        fingerprints = gather(x.tobytes())
        differ = [r for r, f in enumerate(fingerprints) if f != fingerprints[0]]
        assert not differ, f"ranks {differ} differ from rank 0 in some bits: replicas would drift"

    return case


def all_reduce_ledger(module: str, function: str, algorithm: str):
    """The trace ledger's steps and bytes against minipar.cost's formula for the algorithm."""

    def case():
        w = world()
        fn = student(module, function)
        x = np.ones(w.size * 256, np.float32)
        with minipar.trace() as t:
            minipar.all_reduce(x, algorithm=fn)
        everyone = gather((t.steps, t.bytes_sent()))
        want = cost.traffic("all_reduce", algorithm, x.nbytes, w.size)
        steps, sent = max(s for s, _ in everyone), max(b for _, b in everyone)
        assert steps == want.steps, f"{steps} steps; the {algorithm} formula says {want.steps}"
        assert sent == want.bytes_sent, f"sent {sent} bytes; the formula says {want.bytes_sent:g}"
        assert np.all(x == w.size), "and the sum is wrong"

    return case


def all_reduce_plugged(name: str):
    """Registered by name (minipar.exercises.register), the student's algorithm runs through
    minipar like a built-in: here an AVG, which minipar finishes after the algorithm's sum, on a
    2-D float16 array."""

    def case():
        w = world()
        registered = exercises.register(IMPL)  # minipar.register_algorithm for each exercise
        assert f"all_reduce/{name}" in registered and name in minipar.algorithms("all_reduce")
        x = np.full((5, 7), w.rank + 1, dtype=np.float16)
        minipar.all_reduce(x, op=minipar.ReduceOp.AVG, algorithm=name)
        want = np.full((5, 7), sum(range(1, w.size + 1)) / w.size, dtype=np.float16)
        assert np.array_equal(x, want), f"rank {w.rank} has {x[0, :3]}..., want {want[0, 0]}"

    return case


def cases(size):
    table = {}
    for shift in (1, 2, -1):
        table[f"ex02_ring_shift/shift_{shift}"] = ring_shift_case(shift, 100)
    if size in (2, 4):  # lesson 05's cases import torch: two world sizes suffice
        table.update(ex05_cases(size))
    table["ex02_ring_shift/8MiB_no_deadlock"] = ring_shift_case(1, 1 << 20)
    table["ex02_broadcast_linear/every_root"] = broadcast_every_root(
        "ex02_broadcast_linear", "broadcast_linear"
    )
    table["ex02_broadcast_linear/ledger"] = broadcast_linear_ledger()
    table["ex02_broadcast_binomial/every_root"] = broadcast_every_root(
        "ex02_broadcast_binomial", "broadcast_binomial"
    )
    table["ex02_broadcast_binomial/ledger"] = broadcast_binomial_ledger()
    algorithms = [("ex03_ring_allreduce", "all_reduce_ring", "ring")]
    if size & (size - 1) == 0:  # recursive doubling is for powers of two
        algorithms.append(
            ("ex03_recursive_doubling", "all_reduce_recursive_doubling", "recursive_doubling")
        )
    for module, function, algorithm in algorithms:
        table[f"{module}/values"] = all_reduce_values(module, function)
        table[f"{module}/ops"] = all_reduce_ops(module, function)
        table[f"{module}/bitwise_identical"] = all_reduce_bitwise(module, function)
        table[f"{module}/ledger"] = all_reduce_ledger(module, function, algorithm)
        table[f"{module}/plugs_into_minipar"] = all_reduce_plugged(f"student_{algorithm}")
    return table
