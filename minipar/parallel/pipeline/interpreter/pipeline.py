"""Pipeline: one rank's stage, run by the instructions of a schedule over point-to-point messages.

    stage = split(model, minipar.get_world_size())[minipar.get_rank()]
    pipe = Pipeline(stage, n_microbatches=8, schedule="1f1b", loss_fn=F.mse_loss)
    loss = pipe.step(inputs, targets)   # first rank reads inputs, last reads targets

What moves: per micro-batch and stage boundary, one activation forward and one gradient of the
same size backward (`isend`/`recv` on the group's communicator, tag = micro-batch x stage x
kind), so each rank sends m*v activations and m*v gradients per step except at the ends. Every
step opens with one small all-gather that agrees on the layout; the first step (and any new
input shape) also learns every stage's shapes, one all-gather per stage (see plan.py). Sends
never block (their buffers are kept until the end of the step); a receive blocks, bounded by
the group's timeout.

Gradients: each micro-batch's loss is divided by m before its backward, so the parameters'
.grad after a step equals one full-batch backward of the mean loss (grads accumulate, as with
loss.backward(): zero them between steps). The first stage's inputs are data: its backward makes
no gradient for them (torch's pipelining skips it too), unless they require grad; then it makes
one and drops it, so that its B costs what every other stage's does (the equal stages of the
bubble formulas, which the tests time). Backward starts from the scalar sum(output * grad)
(see _Step._objective). For zb-h1, B is torch.autograd.grad of it with respect to the stage
input (retain_graph=True) and W, later, with respect to the parameters.
"""

from __future__ import annotations

import time

from minipar import runtime
from minipar.comm.trace import ledger
from minipar.comm.transport.base import wait_all
from minipar.parallel import activation_memory, replicas
from minipar.parallel.pipeline import schedules as S
from minipar.parallel.pipeline.interpreter import plan

TAG_SPAN = 1 << 15  # minipar's user tags


class Pipeline:
    """Run `stage_module` (with virtual_stages > 1: a list of that many chunks, chunk c being
    global stage c*p + rank) as this rank's part of a pipeline over `group`."""

    def __init__(
        self,
        stage_module,
        group=None,
        n_microbatches: int = 1,
        schedule: str = "1f1b",
        loss_fn=None,
        virtual_stages: int = 1,
    ):
        self.comm = runtime.resolve(group)
        self.p, self.rank = self.comm.size, self.comm.rank
        S.check(schedule, self.p, n_microbatches, virtual_stages)
        self.schedule, self.n_microbatches = schedule, n_microbatches
        self.virtual_stages, self.loss_fn = virtual_stages, loss_fn
        self.chunks = _chunks(stage_module, virtual_stages)
        replicas.mark_sharded(self.parameters(), group)  # each rank its own layers: the norm
        self.device = _device(self.chunks)  # where received activations and gradients land
        self.program = S.instructions(schedule, self.rank, self.p, n_microbatches, virtual_stages)
        self._shapes = {}  # (inputs spec, targets spec) -> every stage's input spec
        self.events = []  # last step: (instruction, start, end) in perf_counter seconds
        self.peak_in_flight = 0  # last step: most micro-batch activations held at once
        self.peak_activation_bytes = 0  # last step: their bytes (autograd's saved tensors,
        # measured by parallel/activation_memory.py)
        self.unit_bytes = {}  # last step: (micro-batch, chunk) -> the bytes its forward kept

    def parameters(self):
        for chunk in self.chunks:
            yield from chunk.parameters()

    def step(self, inputs=None, targets=None, on_instruction=None):
        """One training step; the mean loss (a 0-d tensor) on the last rank, None elsewhere.

        on_instruction(ins), if given, runs after each instruction: a place to start work that
        overlaps the pipeline, such as a data-parallel all-reduce of a finished stage's grads.
        """
        inputs_spec, targets_spec = plan.agree(self, inputs, targets)
        key = (inputs_spec, targets_spec)
        if key not in self._shapes:
            self._shapes[key] = plan.stage_shapes(self, inputs_spec, targets, self.chunks)
        run = _Step(self, self._shapes[key], inputs, targets)
        for ins in self.program:
            start = time.perf_counter()
            with ledger.span(_label(ins, self.virtual_stages), "pipeline"):  # for a trace
                run.execute(ins)
            if isinstance(ins, S.COMPUTE):
                self.events.append((ins, start, time.perf_counter()))
            if on_instruction is not None:
                on_instruction(ins)
        wait_all([req for req, _ in run.sends], self.comm.timeout, "pipeline step: finishing sends")
        self.peak_in_flight, self.peak_activation_bytes = run.peak, run.peak_bytes
        self.unit_bytes = run.unit_bytes
        if self.rank != self.p - 1:
            return None
        import torch

        return torch.stack(run.losses).mean()


def _label(ins, v: int) -> str:
    """An instruction's name on a timeline: "Forward 3" (micro-batch 3), "Forward 3.1" (chunk 1)."""
    return f"{type(ins).__name__} {ins.mb}" + (f".{ins.chunk}" if v > 1 else "")


def _device(chunks):
    """The device of the stage's parameters (CPU for a stage without any)."""
    for chunk in chunks:
        for q in chunk.parameters():
            return q.device
    return "cpu"


def _chunks(stage_module, v: int) -> list:
    if v == 1:
        return [stage_module]
    import torch.nn as nn

    listed = isinstance(stage_module, (list, tuple, nn.ModuleList))
    chunks = list(stage_module) if listed else None
    if chunks is None or len(chunks) != v:
        raise ValueError(
            f"virtual_stages={v} needs a list (or nn.ModuleList) of {v} chunk modules, got "
            f"{type(stage_module).__qualname__}"
        )
    return chunks


class _Step:
    """The state of one step on one rank: stashed activations per (micro-batch, chunk)."""

    def __init__(self, pipe: Pipeline, shapes, inputs, targets):
        import torch

        self.torch, self.pipe, self.shapes = torch, pipe, shapes
        pipe.events = []
        m, self.last = pipe.n_microbatches, pipe.p * pipe.virtual_stages - 1
        self.inputs = inputs.chunk(m) if pipe.rank == 0 else None
        self.targets = targets.chunk(m) if pipe.rank == pipe.p - 1 else None
        self.stash, self.received, self.grads = {}, {}, {}
        self.sends, self.losses = [], []
        self.held, self.peak, self.peak_bytes, self.unit_bytes = {}, 0, 0, {}
        self.params = [[q for q in c.parameters() if q.requires_grad] for c in pipe.chunks]
        keys = activation_memory.storage_key
        self.param_keys = {keys(q) for c in pipe.chunks for q in c.parameters()}

    def execute(self, ins) -> None:
        getattr(self, type(ins).__name__)(ins)

    # -- messages ---------------------------------------------------------------------------
    def _stage(self, ins) -> int:
        return S.stage_of(self.pipe.rank, ins.chunk, self.pipe.p)

    def _tag(self, kind: int, mb: int, receiving_stage: int) -> int:
        return ((mb * (self.last + 1) + receiving_stage) * 2 + kind) % TAG_SPAN

    def _empty(self, spec):
        shape, dtype = spec
        return self.torch.empty(shape, dtype=getattr(self.torch, dtype), device=self.pipe.device)

    def _send(self, tensor, stage: int, kind: int, mb: int) -> None:
        buf = tensor.detach().contiguous()
        rank = S.place_of(stage, self.pipe.p)[0]
        self.sends.append((self.pipe.comm.isend(buf, rank, self._tag(kind, mb, stage)), buf))

    def _recv(self, spec, stage_from: int, kind: int, mb: int, stage: int):
        buf = self._empty(spec)
        rank = S.place_of(stage_from, self.pipe.p)[0]
        self.pipe.comm.recv(buf, rank, self._tag(kind, mb, stage))
        return buf

    def RecvActivation(self, ins) -> None:  # noqa: N802  (named after the instruction)
        stage = self._stage(ins)
        buf = self._recv(self.shapes[stage], stage - 1, 0, ins.mb, stage)
        self.received[ins.mb, ins.chunk] = buf

    def SendActivation(self, ins) -> None:  # noqa: N802
        stage = self._stage(ins)
        self._send(self.stash[ins.mb, ins.chunk][2], stage + 1, 0, ins.mb)

    def RecvGrad(self, ins) -> None:  # noqa: N802
        stage = self._stage(ins)
        buf = self._recv(self.shapes[stage + 1], stage + 1, 1, ins.mb, stage)
        self.grads[ins.mb, ins.chunk] = buf

    def SendGrad(self, ins) -> None:  # noqa: N802
        stage = self._stage(ins)
        self._send(self.received.pop((ins.mb, ins.chunk)).grad_in, stage - 1, 1, ins.mb)

    # -- compute ----------------------------------------------------------------------------
    def Forward(self, ins) -> None:  # noqa: N802
        unit, stage = (ins.mb, ins.chunk), self._stage(ins)
        given = self.received.pop(unit) if stage > 0 else self.inputs[ins.mb]
        x = given.detach()
        if x.is_floating_point() and (stage > 0 or given.requires_grad):
            x.requires_grad_()  # its gradient goes back a stage (the first: see the docstring)
        # the micro-batch's saved activations (weights are not), released as backward runs
        with activation_memory.ActivationMemory(exclude=self.param_keys) as saved:
            y = self.pipe.chunks[ins.chunk](x)
            out = y
            if stage == self.last:
                loss = self.pipe.loss_fn(y, self.targets[ins.mb])
                self.losses.append(loss.detach())
                out = loss / self.pipe.n_microbatches  # so the m backwards sum to the mean's
        self.stash[unit] = [x, out, y]
        self.held[unit], self.unit_bytes[unit] = saved, saved.live
        self.peak = max(self.peak, len(self.held))
        self.peak_bytes = max(self.peak_bytes, sum(c.live for c in self.held.values()))

    def _objective(self, ins):
        """A scalar whose gradient with respect to the chunk's output is the received gradient:
        sum(output * grad) (the last stage's scaled loss as it is). Backward from a scalar, as
        with loss.backward(): passing grad tensors to torch.autograd makes torch import sympy
        on first use, seconds on every rank."""
        out = self.stash[ins.mb, ins.chunk][1]
        if self._stage(ins) == self.last:
            return out
        return (out * self.grads.pop((ins.mb, ins.chunk))).sum()

    def Backward(self, ins) -> None:  # noqa: N802
        unit = (ins.mb, ins.chunk)
        objective = self._objective(ins)
        x = self.stash.pop(unit)[0]
        objective.backward()
        self._done(unit, x, x.grad if x.requires_grad else None)

    def BackwardInput(self, ins) -> None:  # noqa: N802
        unit = (ins.mb, ins.chunk)
        x = self.stash[unit][0]
        objective = self.stash[unit][1] = self._objective(ins)  # kept for W, with its graph
        gx = None
        if x.requires_grad:
            (gx,) = self.torch.autograd.grad(objective, [x], retain_graph=True)
        self.received[unit] = _Sent(gx)

    def BackwardWeight(self, ins) -> None:  # noqa: N802
        unit = (ins.mb, ins.chunk)
        objective = self.stash.pop(unit)[1]
        params = self.params[ins.chunk]
        grads = self.torch.autograd.grad(objective, params, allow_unused=True) if params else []
        for q, g in zip(params, grads):
            if g is not None:
                q.grad = g if q.grad is None else q.grad + g
        del self.held[unit]

    def _done(self, unit, x, gx) -> None:
        self.received[unit] = _Sent(gx)
        del self.held[unit]


class _Sent:
    """The input gradient of a micro-batch, waiting for its SendGrad."""

    def __init__(self, grad_in):
        self.grad_in = grad_in
