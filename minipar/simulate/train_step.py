"""One training step of a dp x pp layout on a simulated cluster, and its timeline.

    step = simulate_step(Step(dp=16, pp=8, microbatches=32, forward_s=2e-3,
                              activation_bytes=16 << 20, gradient_bytes=1 << 30), preset("h100"))
    step.time, step.bubble, step.exposed_comm; write_timeline(step, "step.json")

Every rank runs its pipeline stage's instruction list from minipar/parallel/pipeline/schedules.py
(the schedules as data the real Pipeline interprets): a forward or backward costs its seconds
(FLOPs over FLOP/s, worked out by the caller: minipar.planning's counts), an activation or its
gradient is a point-to-point message of `activation_bytes` to the next or previous stage over
the simulated transport; then the stage's gradients are all-reduced over its dp group by
ring.py (or another algorithm). Ranks are laid Megatron's way, pp outermost: rank = s dp + d,
so a stage's dp group sits together in nodes and the pipeline's hops cross them.

What it reads off simulated time: the step, the bubble (the share of the step a stage spends
neither computing nor all-reducing, before its gradients are reduced; the planner's formula is
(p-1)/(m+p-1)), and the exposed communication (the gradient all-reduce, which here does not
overlap backward: DDP's buckets would hide part of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minipar.collectives import api
from minipar.comm.trace import chrome_trace
from minipar.parallel.pipeline import schedules
from minipar.simulate.runner import group, simulate
from minipar.state import process

REAL = 8  # float32 elements a real message holds; the group's scale makes them the bytes asked


@dataclass(frozen=True)
class Step:
    dp: int
    pp: int
    microbatches: int
    forward_s: float  # one micro-batch forward through one stage
    activation_bytes: float  # one micro-batch's activation at a stage boundary
    gradient_bytes: float  # one stage's gradients (its parameters' share), all-reduced over dp
    backward_ratio: float = 2.0  # backward costs this many forwards
    schedule: str = "1f1b"
    algorithm: str = "ring"  # the gradient all-reduce's


@dataclass
class StepRun:
    step: Step
    time: float
    bubble: float  # measured, on the busiest stage's clock
    exposed_comm: float  # seconds of the gradient all-reduce after the last backward
    events: list = field(default_factory=list)  # (rank, name, start, end)
    messages: int = 0

    @property
    def predicted_bubble(self) -> float:
        p, m = self.step.pp, self.step.microbatches
        return (p - 1) / (m + p - 1)


def simulate_step(step: Step, cluster) -> StepRun:
    """Run one step on dp x pp simulated ranks of `cluster`."""
    for name in ("dp", "pp", "microbatches"):
        value = getattr(step, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    schedules.check(step.schedule, step.pp, step.microbatches)
    size = step.dp * step.pp
    events: list = []

    def rank_fn(rank):
        return _run_rank(step, rank, events)

    run = simulate(rank_fn, size, cluster)
    computing = max(r[0] for r in run.results)
    before = max(r[1] for r in run.results)  # when the last stage's backward ended
    bubble = 1 - computing / before if before > 0 else 0.0
    return StepRun(step, run.time, bubble, run.time - before, events, run.messages)


def _run_rank(step: Step, rank: int, events: list):
    """This rank's stage: its schedule, then its dp all-reduce. (busy seconds, end of backward)."""
    task = process.world.task
    s, d = divmod(rank, step.dp)
    pp = group([q * step.dp + d for q in range(step.pp)], step.activation_bytes / (4 * REAL))
    dp = group(
        [s * step.dp + q for q in range(step.dp)], step.gradient_bytes / (4 * REAL * step.dp)
    )
    buf = np.zeros(REAL, np.float32)
    busy = 0.0
    costs = {
        schedules.Forward: step.forward_s,
        schedules.Backward: step.forward_s * step.backward_ratio,
    }
    for ins in schedules.instructions(step.schedule, s, step.pp, step.microbatches):
        start = task.clock
        kind = type(ins)
        if kind in costs:
            task.clock += costs[kind]
            busy += costs[kind]
        elif kind is schedules.SendActivation:
            pp.send(buf, s + 1, 0)
        elif kind is schedules.SendGrad:
            pp.send(buf, s - 1, 1)
        elif kind is schedules.RecvActivation:
            pp.recv(buf, s - 1, 0)
        elif kind is schedules.RecvGrad:
            pp.recv(buf, s + 1, 1)
        events.append((rank, str(ins), start, task.clock))
    end = task.clock
    grads = np.ones(REAL * step.dp, np.float32)
    if step.dp > 1:
        api.all_reduce(grads, group=dp, algorithm=step.algorithm)
    events.append((rank, f"all_reduce ({step.algorithm}) over dp", end, task.clock))
    return busy, end


def write_timeline(run: StepRun, path: str) -> str:
    """The step as Chrome trace events (Perfetto): one process per rank, a slice per
    instruction and for the gradient all-reduce, simulated microseconds."""
    events = []
    for rank in sorted({e[0] for e in run.events}):
        events += chrome_trace._metadata(rank, [(0, "MainThread")])
    for rank, name, start, end in run.events:
        ts, end = round(start * 1e6, 3), round(end * 1e6, 3)  # microseconds, as rounded
        if end > ts:  # a nanosecond short: back-to-back slices must not overlap by a rounding
            events.append(chrome_trace._slice(name, "simulated", ts, end - 1e-3, rank, 0, {}))
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"simulated": True}}
    return chrome_trace.write(doc, path)


def from_layout(model, layout, value_bytes: int = 2) -> Step:
    """The Step of a layout `minipar plan` proposes: its compute (the planner's FLOP count over
    the GPU's FLOP/s, with tensor parallelism's all-reduces, which stay inside a node) split
    into forwards and backwards (1 : 2), a micro-batch's activations (b s h), and a stage's
    gradients (its parameters over tp x pp). A tp group is simulated as one rank."""
    m, lay = model, layout
    compute = lay.time["compute"] + lay.time["tp_comm"]
    return Step(
        dp=lay.dp * lay.cp,
        pp=lay.pp,
        microbatches=lay.microbatches,
        forward_s=compute / (3 * lay.microbatches),
        activation_bytes=lay.micro_batch * m.seq_len / lay.cp * m.hidden * value_bytes,
        gradient_bytes=(m.params - m.expert_params) / (lay.tp * lay.pp) * value_bytes,
    )
