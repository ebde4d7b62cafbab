"""The exercises' multi-rank tests (run on every rank by minipar.testing): one suite grades either
tree. MINIPAR_EXERCISES_IMPL names the folder whose exN_*.py files are tested (default: the
repository's solutions/); `pytest --impl=exercises` and `minipar grade` set it.

Case names start with the exercise's file name, so `minipar grade 03` can select them. Every case
calls the student's function before it asserts anything, so an untouched exercise fails with
its NotImplementedError and nothing else.
"""

import contextlib
import functools
import os

import numpy as np
from exercises_ex05 import ex05_cases
from exercises_ex10 import ex10_cases

import minipar
from minipar import cost, exercises
from minipar.collectives.call import Call
from minipar.course import stepdiff, whose

IMPL = os.environ.get("MINIPAR_EXERCISES_IMPL", "solutions")


def student(module: str, function: str):
    """The student's function, graded beside the worked solution's (minipar.course.stepdiff):
    when a case fails, the grader names the first step where the two part. Any exercise whose
    function takes a Call first gets this; the solution's PHASES (if any) names its
    call.rounds() loops."""
    if exercises.tree(IMPL) == exercises.tree("solutions"):
        return getattr(exercises.load(module, IMPL), function)
    reference = worked(module)
    mine = getattr(exercises.load(module, IMPL), function)
    if reference is None:  # a course that ships no solutions: grade without explaining
        return mine
    return stepdiff.graded(
        mine,
        getattr(reference, function, None),
        getattr(reference, "PHASES", ()),
        getattr(reference, "chunks_of_x", None),
    )


@functools.cache
def worked(module: str):
    """The worked answer's module, or None where the course ships none. Loaded before any
    student's file: from then on the grader hides solutions/ from this process (sandbox.py)."""
    try:
        return exercises.load(module, "solutions")
    except FileNotFoundError:
        return None


if os.environ.get("MINIPAR_GRADE_HIDE"):  # grading: every chosen exercise's answer read now
    for _name in filter(None, os.environ.get("MINIPAR_EXERCISES_ONLY", "").split(",")):
        worked(_name)


def world():
    return minipar.init()


def gather(obj):
    return world().allgather_object(obj)


@functools.cache
def control():
    """The grader's own group, for pooling notes after a case (a failed case can leave the world
    group's collective numbering out of step; the harness realigns it only afterwards)."""
    w = world()
    group = w.split(list(range(w.size)), name="grader")
    group.timeout = 3 * w.timeout + 5  # the others may still be waiting out a timeout
    return group


# -- whose data: inputs whose values name their source, so a wrong element says what it holds ----


def whose_ring_shift(count: int = 12):
    def case():
        w = world()
        ring_shift = student("ex02_ring_shift", "ring_shift")
        stepdiff.describe_values(whose.copy_words)
        x, out = whose.copy_input(w.rank, count), np.full(count, -1.0)
        ring_shift(Call(w, "ring_shift", "student"), x, out, 1)
        want = whose.copy_input((w.rank - 1) % w.size, count)
        wrong = whose.first_wrong(out, want, whose.copy_words, w.rank, "out element")
        assert wrong is None, wrong

    return case


def whose_broadcast(module: str, function: str):
    def case():
        w = world()
        fn = student(module, function)
        stepdiff.describe_values(whose.copy_words)
        root, count = w.size - 1, 4 * w.size + 1
        x = whose.copy_input(w.rank, count)
        minipar.broadcast(x, src=root, algorithm=fn)
        wrong = whose.first_wrong(x, whose.copy_input(root, count), whose.copy_words, w.rank)
        assert wrong is None, f"broadcast from rank {root}: {wrong}"

    return case


def whose_all_reduce(module: str, function: str, nodes=contextlib.nullcontext):
    """Rank r holds whose.sum_input: a sum's digits name the ranks and elements it holds (inside
    `nodes()`: two_nodes for the two-level exercise)."""

    def case():
        w = world()
        p, count = w.size, 4 * w.size
        fn = student(module, function)

        def words(value, index=None):
            return whose.sum_words(value, p, index)

        stepdiff.describe_values(words)
        x = whose.sum_input(w.rank, p, count)
        with nodes():
            minipar.all_reduce(x, algorithm=fn)
        want = sum(whose.sum_input(r, p, count) for r in range(p))
        wrong = whose.first_wrong(x, want, words, w.rank)
        assert wrong is None, wrong

    return case


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
        assert name in registered and name in minipar.algorithms("all_reduce"), registered
        x = np.full((5, 7), w.rank + 1, dtype=np.float16)
        minipar.all_reduce(x, op=minipar.ReduceOp.AVG, algorithm=name)
        want = np.full((5, 7), sum(range(1, w.size + 1)) / w.size, dtype=np.float16)
        assert np.array_equal(x, want), f"rank {w.rank} has {x[0, :3]}..., want {want[0, 0]}"

    return case


# -- ex04: the two-level all-reduce, on 4 ranks told they sit on 2 nodes of 2 ----------------------


@contextlib.contextmanager
def two_nodes():
    """The world's node map says ranks 0, 1 are node 0 and ranks 2, 3 node 1 (data only: the
    bytes move between the same processes; `minipar run --nodes 2` makes the nodes real)."""
    from minipar.runtime import nodes
    from minipar.state import process

    saved = process.nodes
    process.nodes = nodes.from_keys([(r // 2, f"node{r // 2}") for r in range(4)], "grader")
    try:
        yield
    finally:
        process.nodes = saved


def process_nodes() -> list:
    """The node of each world rank, as the real node map says (runtime/nodes.py)."""
    from minipar.state import process

    w = world()
    return list(process.nodes.of_group(range(w.size))) if process.nodes is not None else [0]


def two_level_values():
    """The sum against numpy (even, uneven and tiny counts), the same bits on every rank; on
    one node it must be the ring's result, bit for bit (step 2 has nothing to do)."""
    module, function = "ex04_hierarchical_allreduce", "all_reduce_two_level"

    def case():
        w = world()
        fn = student(module, function)
        parts = [
            np.random.default_rng(r).standard_normal(4099).astype(np.float32) for r in range(4)
        ]
        with two_nodes():
            for count in (16, 19, 3):
                x = np.arange(count, dtype=np.float64) * (w.rank + 1)
                minipar.all_reduce(x, algorithm=fn)
                want = np.arange(count, dtype=np.float64) * 10
                assert np.array_equal(x, want), f"count {count}: rank {w.rank} has {x[:4]}..."
            x = parts[w.rank].copy()
            minipar.all_reduce(x, algorithm=fn)
            assert np.allclose(x, np.sum(np.stack(parts).astype(np.float64), 0), atol=1e-5)
            differ = [r for r, f in enumerate(gather(x.tobytes())) if f != x.tobytes()]
            assert not differ, f"ranks {differ} differ from rank {w.rank} in some bits"
        if len(set(process_nodes())) > 1:
            return  # on emulated nodes (minipar grade --nodes): no single node to compare on
        x, flat = parts[w.rank].copy(), parts[w.rank].copy()
        minipar.all_reduce(x, algorithm=fn)  # the real node map: one node
        minipar.all_reduce(flat, algorithm="ring")
        assert np.array_equal(x, flat), "on one node the two-level all-reduce is the ring"

    return case


def two_level_ledger():
    """Steps, bytes inside and between nodes against minipar.cost.traffic_on_nodes."""
    module, function = "ex04_hierarchical_allreduce", "all_reduce_two_level"

    def case():
        fn = student(module, function)
        x = np.ones(4 * 256, np.float32)
        with two_nodes(), minipar.trace() as t:
            minipar.all_reduce(x, algorithm=fn)
        everyone = gather((t.steps, t.bytes_sent(link="intra"), t.bytes_sent(link="inter")))
        steps, intra, inter = (max(v) for v in zip(*everyone))
        inside, between = cost.traffic_on_nodes("all_reduce", "hierarchical", x.nbytes, 2, 2)
        want_steps = inside.steps + between.steps
        assert steps == want_steps, f"{steps} steps; two levels take {want_steps}"
        assert inter == between.bytes_sent, (
            f"sent {inter} bytes between nodes; the formula says {between.bytes_sent:g}"
        )
        assert intra == inside.bytes_sent, (
            f"sent {intra} bytes inside a node, not {inside.bytes_sent:g}"
        )
        assert np.all(x == 4), "and the sum is wrong"

    return case


# -- ex06: tensor parallelism (torch imported only in these cases) --------------------------------

TP_RTOL = 1e-5  # float32, relative to the largest magnitude: see tests/ranks/tensor_parallel.py


def tp_close(got, want, what, shard=""):
    """got == want within TP_RTOL (relative to the largest magnitude), or an AssertionError
    naming `what`, this rank's `shard` and the first element off."""
    import numpy as np

    if got.shape != want.shape:
        raise AssertionError(
            f"{what}{shard}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        )
    scale = max(want.abs().max().item(), 1e-30)
    off = ((got - want).abs() / scale > TP_RTOL).reshape(-1)
    if bool(off.any()):
        i = int(off.nonzero()[0])
        at = [int(j) for j in np.unravel_index(i, tuple(want.shape))]
        raise AssertionError(
            f"{what}{shard}, element {at}: yours {got.reshape(-1)[i].item():.6g}, the reference "
            f"{want.reshape(-1)[i].item():.6g} ({int(off.sum())} of {off.numel()} elements off)"
        )


def tp_calls(trace, what: str, want: int, role: str):
    """The collectives `what` made: `want` all-reduces, or an AssertionError saying which of f
    and g (Megatron's names) makes them."""
    made = [c.collective for c in trace.calls]
    if made != ["all_reduce"] * want:
        raise AssertionError(
            f"{what} made {len(made)} collective(s){f' {made}' if made else ''}; it should "
            f"make {want}: {role}"
        )


def tp_dense(seed):
    """The same x, layer and upstream gradient on every rank, and torch autograd's answers."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 8, generator=g, requires_grad=True)
    w = torch.randn(12, 8, generator=g, requires_grad=True)
    b = torch.randn(12, generator=g, requires_grad=True)
    y = x @ w.T + b
    dy = torch.randn(y.shape, generator=g)
    (y * dy).sum().backward()
    return x, w, b, y.detach(), dy


F_ROLE = "f is the identity going forward and an all-reduce of grad_x going backward"
G_ROLE = "g is an all-reduce of the output going forward and the identity going backward"


def column_case():
    def case():
        w_ = world()
        r, p = w_.rank, w_.size
        forward = student("ex06_column_row_parallel", "column_forward")
        backward = student("ex06_column_row_parallel", "column_backward")
        x, w, b, y, dy = tp_dense(1)
        rows = slice(r * 12 // p, (r + 1) * 12 // p)
        shard = f" on rank {r} (shard: output features {rows.start}:{rows.stop} of 12)"
        with minipar.trace() as fwd:
            got = forward(x.detach(), w.detach()[rows], b.detach()[rows])
        with minipar.trace() as bwd:
            gx, gw, gb = backward(dy[..., rows].contiguous(), x.detach(), w.detach()[rows])
        tp_calls(fwd, "column forward (f)", 0, F_ROLE)
        tp_calls(bwd, "column backward (f's backward)", int(p > 1), F_ROLE)
        tp_close(got, y[..., rows], "column forward", shard)
        tp_close(gx, x.grad, "column grad_x (the full input's, after f's all-reduce)", shard)
        tp_close(gw, w.grad[rows], "column grad_weight", shard)
        tp_close(gb, b.grad[rows], "column grad_bias", shard)

    return case


def row_case():
    def case():
        w_ = world()
        r, p = w_.rank, w_.size
        forward = student("ex06_column_row_parallel", "row_forward")
        backward = student("ex06_column_row_parallel", "row_backward")
        x, w, b, y, dy = tp_dense(2)
        cols = slice(r * 8 // p, (r + 1) * 8 // p)
        shard = f" on rank {r} (shard: input features {cols.start}:{cols.stop} of 8)"
        x_part = x.detach()[..., cols].contiguous()
        with minipar.trace() as fwd:
            got = forward(x_part, w.detach()[:, cols].contiguous(), b.detach())
        with minipar.trace() as bwd:
            gx, gw, gb = backward(dy, x_part, w.detach()[:, cols].contiguous())
        tp_calls(fwd, "row forward (g)", int(p > 1), G_ROLE)
        tp_calls(bwd, "row backward (g's backward)", 0, G_ROLE)
        tp_close(got, y, "row forward (after g's all-reduce; the bias added once?)", shard)
        tp_close(gx, x.grad[..., cols], "row grad_x_part", shard)
        tp_close(gw, w.grad[:, cols], "row grad_weight", shard)
        tp_close(gb, b.grad, "row grad_bias", shard)

    return case


def vocab_cross_entropy_case():
    def case():
        import torch
        from torch.nn import functional as F

        w_ = world()
        r, p = w_.rank, w_.size
        fn = student("ex06_vocab_parallel_cross_entropy", "vocab_parallel_cross_entropy")
        g = torch.Generator().manual_seed(3)
        vocab = 12
        # logits of about 4, then of about 400: exp overflows float32 past 88, so only the
        # global max subtracted keeps the second finite
        for scale in (4, 400):
            logits = (scale * torch.randn(2, 5, vocab, generator=g)).requires_grad_()
            target = torch.randint(0, vocab, (2, 5), generator=g)
            target[0, :p] = torch.arange(p) * (vocab // p)  # a target in every rank's slice
            want = F.cross_entropy(logits.view(-1, vocab), target.view(-1), reduction="none")
            want.sum().backward()
            mine = logits.detach().chunk(p, dim=-1)[r].contiguous()
            with minipar.trace() as t:
                loss, grad = fn(mine, target)
            what = f"logits of about {scale}"
            shard = f" on rank {r} (vocabulary slice {r * vocab // p}:{(r + 1) * vocab // p})"
            made = len(t.calls)
            tip = f" (you made {made} all-reduce(s); the reference 2: the MAX, then the sums)"
            tp_close(loss.reshape(2, 5), want.detach().reshape(2, 5), f"loss, {what}{tip}", shard)
            tp_close(grad, logits.grad.chunk(p, dim=-1)[r], f"gradient, {what}{tip}", shard)
            assert all(c.collective == "all_reduce" for c in t.calls), (
                "only all-reduces, please (never gather the logits): "
                f"{[c.collective for c in t.calls]}"
            )
            # each call's payload from its bytes (every formula is linear in the payload)
            per_byte = [cost.traffic("all_reduce", c.algorithm, 1.0, p).bytes_sent for c in t.calls]
            payload = sum(c.bytes_sent / k for c, k in zip(t.calls, per_byte) if k)
            assert payload <= 3 * 10 * 4 + 1e-6, f"{payload:g} bytes all-reduced for 10 tokens"

    return case


# -- ex07: the pipeline interpreter's send and receive step -----------------------------------


class Posted:
    """Stands in for the pipeline's group in message_step: notes the (operation, peer, tag) of
    each isend or recv, calls `check()`, then passes it on to `comm` (None: a dry run in which
    nothing moves)."""

    def __init__(self, comm, rank: int, size: int, check=lambda: None):
        self.comm, self.rank, self.size, self.check, self.posted = comm, rank, size, check, []

    def isend(self, buf, dst, tag=0):
        self.posted.append(("sends to", dst, tag))
        self.check()
        return self.comm.isend(buf, dst, tag) if self.comm is not None else None

    def recv(self, buf, src, tag=0):
        self.posted.append(("receives from", src, tag))
        self.check()
        if self.comm is not None:
            self.comm.recv(buf, src, tag)


def checked_step(step, reference, w, index: int, ins, n_stages: int, **kwargs):
    """The student's message_step for one instruction, its message compared with the
    reference's (the docstring fixes the peer and the tag) before it moves: a difference is
    named at once, before anyone waits for a message that went elsewhere."""
    dry = Posted(None, w.rank, w.size)
    reference(dry, ins, n_stages, **kwargs)

    def said(post) -> str:
        return "{} rank {} with tag {}".format(*post[0]) if post else "posts nothing"

    def compare():
        if mine.posted[:1] != dry.posted[:1]:
            raise AssertionError(
                f"rank {w.rank}, instruction {index} {ins} (stage {ins.chunk * w.size + w.rank}"
                f" of {n_stages}): yours {said(mine.posted[:1])}; the reference "
                f"{said(dry.posted[:1])}"
            )

    mine = Posted(w, w.rank, w.size, compare)
    out = step(mine, ins, n_stages, **kwargs)
    compare()
    return out


def pipeline_messages(schedule: str, v: int):
    """Run minipar's schedule by hand with the student's message_step for every message: stage s
    multiplies by (s + 2) forward and backward, so every value that arrives can be checked."""

    def case():
        import torch

        from minipar.comm.transport.base import wait_all
        from minipar.parallel.pipeline import schedules as S

        w = world()
        step = student("ex07_send_recv", "message_step")
        reference = worked("ex07_send_recv").message_step
        p, m, n_stages = w.size, 4, w.size * v
        got, outs, grads, pending, results = {}, {}, {}, [], {}

        def product(stages):
            out = 1.0
            for s in stages:
                out *= s + 2
            return out

        for index, ins in enumerate(S.instructions(schedule, w.rank, p, m, v)):
            stage, unit = ins.chunk * p + w.rank, (ins.mb, ins.chunk)
            where = f"rank {w.rank}, instruction {index} {ins} (stage {stage})"
            if isinstance(ins, (S.SendActivation, S.SendGrad)):
                tensor = outs[unit] if isinstance(ins, S.SendActivation) else grads[unit]
                pending.append(
                    checked_step(step, reference, w, index, ins, n_stages, tensor=tensor)
                )
            elif isinstance(ins, (S.RecvActivation, S.RecvGrad)):
                buf = checked_step(
                    step, reference, w, index, ins, n_stages, shape=(3,), dtype=torch.float64
                )
                if isinstance(ins, S.RecvActivation):
                    want = product(range(stage)) * (ins.mb + 1)
                else:
                    want = product(range(stage + 1, n_stages))
                assert torch.all(buf == want), (
                    f"{where}: received {buf.tolist()}, expected {want:g} in every element"
                )
                got[type(ins).__name__, unit] = buf
            elif isinstance(ins, S.Forward):
                x = got.pop(("RecvActivation", unit), None)
                x = torch.full((3,), ins.mb + 1.0, dtype=torch.float64) if stage == 0 else x
                outs[unit] = x * (stage + 2)
                if stage == n_stages - 1:
                    results["out", ins.mb] = outs[unit]
            else:
                g = got.pop(("RecvGrad", unit), None) if stage < n_stages - 1 else None
                g = torch.ones(3, dtype=torch.float64) if g is None else g
                grads[unit] = g * (stage + 2)
                if stage == 0:
                    results["grad", ins.mb] = grads[unit]
        wait_all(pending, w.timeout)
        for (what, mb), value in results.items():
            want = product(range(n_stages)) * (mb + 1 if what == "out" else 1)
            assert torch.all(value == want), f"{what} of micro-batch {mb}: {value}, want {want}"
        expected = (w.rank == p - 1) * m + (w.rank == 0) * m
        assert len(results) == expected, f"rank {w.rank} finished {len(results)} results"

    return case


# -- ex09: context parallelism: the student's merge and split inside minipar's ring attention ---


def ring_with_student(merge=None, split=None):
    """Ring attention on real ranks against dense attention, with the student's merge inside it
    (minipar's own merge swapped out for the case) or the student's split cutting the shards."""

    def case():
        import torch
        from torch.nn import functional as F

        from minipar.parallel.context import online_softmax, ring_attention, shard_sequence

        w_ = world()
        merge_fn = student("ex09_online_softmax_merge", "merge") if merge else None
        split_fn = student("ex09_load_balanced_split", "split") if split else None
        g = torch.Generator().manual_seed(4)
        q, k, v, dy = (torch.randn(2, 2, 8 * w_.size, 4, generator=g) for _ in range(4))
        if merge_fn:  # called once before any message: an unstarted merge fails right here
            probe = online_softmax.block_attention(q, k, v)
            merge_fn(*probe, *probe)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        (want * dy).sum().backward()
        if split_fn:
            cut = lambda t: split_fn(t.detach(), 2, w_.rank, w_.size)  # noqa: E731
        else:
            cut = lambda t: shard_sequence(t.detach(), 2, causal=True)  # noqa: E731
        shards = [cut(t).requires_grad_() for t in (q, k, v)]
        own = online_softmax.merge
        online_softmax.merge = merge_fn or own
        try:
            out = ring_attention(*shards, causal=True)
            (out * cut(dy)).sum().backward()
        finally:
            online_softmax.merge = own
        tp_close(out, cut(want), "ring attention's output")
        for name, shard, t in zip("qkv", shards, (q, k, v)):
            tp_close(shard.grad, cut(t.grad), f"gradient of {name}")

    return case


def cases(size):
    table = {}
    if size >= 2:
        table["ex07_send_recv/1f1b"] = pipeline_messages("1f1b", 1)
        table["ex07_send_recv/interleaved"] = pipeline_messages("interleaved", 2)
    table["ex02_ring_shift/whose_data"] = whose_ring_shift()
    for shift in (1, 2, -1):
        table[f"ex02_ring_shift/shift_{shift}"] = ring_shift_case(shift, 100)
    if size in (2, 4):  # lesson 05's cases import torch: two world sizes suffice
        table.update(ex05_cases(size))
    table["ex02_ring_shift/8MiB_no_deadlock"] = ring_shift_case(1, 1 << 20)
    for module, function in (
        ("ex02_broadcast_linear", "broadcast_linear"),
        ("ex02_broadcast_binomial", "broadcast_binomial"),
    ):  # whose data first: its failure says most
        table[f"{module}/whose_data"] = whose_broadcast(module, function)
        table[f"{module}/every_root"] = broadcast_every_root(module, function)
    table["ex02_broadcast_linear/ledger"] = broadcast_linear_ledger()
    table["ex02_broadcast_binomial/ledger"] = broadcast_binomial_ledger()
    algorithms = [("ex03_ring_allreduce", "all_reduce_ring", "ring")]
    if size & (size - 1) == 0:  # recursive doubling is for powers of two
        algorithms.append(
            ("ex03_recursive_doubling", "all_reduce_recursive_doubling", "recursive_doubling")
        )
    for module, function, algorithm in algorithms:
        table[f"{module}/whose_data"] = whose_all_reduce(module, function)
        table[f"{module}/values"] = all_reduce_values(module, function)
        table[f"{module}/ops"] = all_reduce_ops(module, function)
        table[f"{module}/bitwise_identical"] = all_reduce_bitwise(module, function)
        table[f"{module}/ledger"] = all_reduce_ledger(module, function, algorithm)
        table[f"{module}/plugs_into_minipar"] = all_reduce_plugged(f"student_{algorithm}")
    if size == 4:  # told they sit on 2 nodes of 2
        table["ex04_hierarchical_allreduce/whose_data"] = whose_all_reduce(
            "ex04_hierarchical_allreduce", "all_reduce_two_level", two_nodes
        )
        table["ex04_hierarchical_allreduce/values"] = two_level_values()
        table["ex04_hierarchical_allreduce/ledger"] = two_level_ledger()
        table["ex04_hierarchical_allreduce/plugs_into_minipar"] = all_reduce_plugged(
            "student_two_level"
        )
    if size in (2, 4):  # torch costs seconds to import on every rank: two world sizes suffice
        table["ex06_column_row_parallel/column"] = column_case()
        table["ex06_column_row_parallel/row"] = row_case()
        table["ex06_vocab_parallel_cross_entropy/values_and_ledger"] = vocab_cross_entropy_case()
        table["ex09_online_softmax_merge/in_ring_attention"] = ring_with_student(merge=True)
        table["ex09_load_balanced_split/ring_attention"] = ring_with_student(split=True)
        table.update(ex10_cases(size))
    # `minipar grade NAME` runs only the chosen exercises' cases (MINIPAR_EXERCISES_ONLY)
    only = [n for n in os.environ.get("MINIPAR_EXERCISES_ONLY", "").split(",") if n]
    if only:
        table = {k: v for k, v in table.items() if k.split("/")[0] in only}
    # every case explains its own failure: the first step where it parts from the solution
    return {
        name: first_failure(name, stepdiff.explained(case, control, failed(name)))
        for name, case in table.items()
    }


FAILED = set()  # the exercises with a failed case in this job (on any rank)
# grading: a case still running after CASE_LIMIT seconds is hung (its ranks' stacks are named);
# it and the rest of its exercise's cases cost that exercise only (testing/pool.py)
LIMIT_ENV = "MINIPAR_GRADE_CASE_LIMIT"
CASE_LIMIT = float(os.environ.get(LIMIT_ENV) or 30) if os.environ.get("MINIPAR_GRADE_HIDE") else 0


def group_of(name: str) -> str:
    """A case's exercise: a case that hangs or kills its job takes the exercise's others along."""
    return name.split("/")[0]


def failed(name: str):
    return lambda: FAILED.add(name.split("/")[0])


def first_failure(name: str, case):
    """Once one case of an exercise failed, its later cases in this job are not run (the grader
    reports the first failure of each exercise; a deadlocked one would wait out each timeout)."""

    @functools.wraps(case)
    def run():
        exercise = name.split("/")[0]
        if exercise in FAILED:
            raise AssertionError(f"not run: an earlier case of {exercise} failed")
        case()

    return run
