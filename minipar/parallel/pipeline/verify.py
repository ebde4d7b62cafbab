"""Run every rank's instruction list at once, with no communication: prove the schedule sound
and predict its bubble.

    report = verify(program("1f1b", p=4, m=8), costs={"Forward": 1, "Backward": 2})
    report.bubble_fraction   # 3/11: (p-1)/(m+p-1)

Each rank has a clock. A compute instruction advances it by its cost; a send posts its message
at the rank's clock (plus `latency`) and never blocks; a receive waits until its message exists.
The ranks take turns until all have finished; a full round in which no rank can move is a
deadlock, reported with what each stuck rank waits for. Along the way every instruction is
checked against the data it needs (a forward after its activation arrived, a backward after
its forward and its gradient, W after B, a send after the compute that made its tensor), and at
the end every message must have been received exactly once and every micro-batch must have gone
forward and backward through every chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipar.errors import MiniparError
from minipar.parallel.pipeline import schedules as S

DEFAULT_COSTS = {"Forward": 1.0, "Backward": 2.0, "BackwardInput": 1.0, "BackwardWeight": 1.0}


class ScheduleError(MiniparError):
    """A schedule that deadlocks, loses a message, or uses a tensor before it exists."""


@dataclass
class Report:
    p: int
    m: int
    v: int
    makespan: float  # first compute start to last compute end, over all ranks
    busy: list[float]  # compute time of each rank
    peak_in_flight: list[int]  # most (micro-batch, chunk) activations each rank held at once
    events: list[list[tuple]] = field(default_factory=list)  # per rank: (instruction, start, end)

    @property
    def bubble(self) -> list[float]:
        """Each rank's idle share of the makespan."""
        return [1 - b / self.makespan if self.makespan else 0.0 for b in self.busy]

    @property
    def bubble_fraction(self) -> float:
        return sum(self.bubble) / self.p


def predicted_bubble(name: str, p: int, m: int, v: int = 1) -> float:
    """The textbook bubble fraction with equal per-stage costs (F, B = 2F; zb-h1: F = B = W)."""
    if name in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if name == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if name == "zb-h1":
        return (p - 1) / (3 * m + p - 1)
    raise ValueError(f"no bubble formula for schedule {name!r}")


class _Rank:
    def __init__(self, rank: int, program: list, p: int, v: int):
        self.rank, self.program, self.p, self.v = rank, program, p, v
        self.pc, self.clock, self.busy = 0, 0.0, 0.0
        self.fwd, self.bwd, self.wgt, self.got = set(), set(), set(), set()
        self.in_flight, self.peak, self.events = 0, 0, []
        self.first = None  # start of this rank's first compute

    def where(self, ins) -> str:
        return f"rank {self.rank} instruction {self.pc} {ins}"


def verify(program: list[list], costs=None, latency: float = 0.0, m=None, v=None) -> Report:
    """Simulate every rank's list (program[r] for rank r); raise ScheduleError or return a Report.

    costs: seconds per compute instruction, by class name (see DEFAULT_COSTS), or a function
    (rank, instruction) -> seconds. m and v are read from the program when not given.
    """
    p = len(program)
    flat = [ins for rank in program for ins in rank]
    m = m if m is not None else 1 + max((i.mb for i in flat), default=-1)
    v = v if v is not None else 1 + max((i.chunk for i in flat), default=-1)
    cost = _cost_function(costs)
    ranks = [_Rank(r, list(program[r]), p, v) for r in range(p)]
    mailbox: dict = {}  # (kind, mb, receiving stage) -> time the message is available
    while any(r.pc < len(r.program) for r in ranks):
        moved = False
        for r in ranks:
            while r.pc < len(r.program) and _step(r, mailbox, cost, latency, p, v):
                r.pc += 1
                moved = True
        if not moved:
            raise ScheduleError("deadlock: " + "; ".join(_stuck(r) for r in ranks))
    _check_complete(ranks, mailbox, m, v, p)
    starts = [r.first for r in ranks if r.first is not None]
    makespan = max(r.clock for r in ranks) - min(starts) if starts else 0.0
    return Report(p, m, v, makespan, [r.busy for r in ranks], [r.peak for r in ranks],
                  [r.events for r in ranks])  # fmt: skip


def _cost_function(costs):
    if callable(costs):
        return costs
    table = dict(DEFAULT_COSTS, **(costs or {}))
    return lambda rank, ins: table[type(ins).__name__]


def _stuck(r: _Rank) -> str:
    if r.pc >= len(r.program):
        return f"rank {r.rank} finished"
    return f"rank {r.rank} waits at {r.program[r.pc]} (instruction {r.pc})"


def _key(r: _Rank, ins, p: int) -> tuple:
    """The mailbox slot a send fills or a receive empties: (kind, mb, receiving stage)."""
    stage = S.stage_of(r.rank, ins.chunk, p)
    if isinstance(ins, S.SendActivation):
        return ("act", ins.mb, stage + 1)
    if isinstance(ins, S.SendGrad):
        return ("grad", ins.mb, stage - 1)
    return ("act" if isinstance(ins, S.RecvActivation) else "grad", ins.mb, stage)


def _step(r: _Rank, mailbox, cost, latency: float, p: int, v: int) -> bool:
    """Run r's next instruction if it can run now; False if it must wait for a message."""
    ins = r.program[r.pc]
    unit = (ins.mb, ins.chunk)
    stage, last = S.stage_of(r.rank, ins.chunk, p), p * v - 1
    if not 0 <= ins.chunk < v:
        raise ScheduleError(f"{r.where(ins)}: chunk out of range 0..{v - 1}")
    if isinstance(ins, S.RECVS):
        key = _key(r, ins, p)
        if (
            not 0 <= key[2] <= last
            or (key[0] == "act" and stage == 0)
            or (key[0] == "grad" and stage == last)
        ):
            raise ScheduleError(f"{r.where(ins)}: stage {stage} has nobody to receive from")
        if key not in mailbox:
            return False
        when = mailbox.pop(key)
        if when is None:
            raise ScheduleError(f"{r.where(ins)}: message {key} received twice")
        mailbox[key] = None  # received; a second receive or send of it is an error
        r.clock = max(r.clock, when)
        r.got.add(key)
        return True
    if isinstance(ins, S.SENDS):
        key = _key(r, ins, p)
        if not 0 <= key[2] <= last:
            raise ScheduleError(f"{r.where(ins)}: stage {stage} has nobody to send to")
        made = r.fwd if isinstance(ins, S.SendActivation) else r.bwd
        if unit not in made:
            raise ScheduleError(f"{r.where(ins)}: sends a tensor it has not computed yet")
        if key in mailbox:
            raise ScheduleError(f"{r.where(ins)}: message {key} sent twice")
        mailbox[key] = r.clock + latency
        return True
    _check_ready(r, ins, unit, stage, last)
    seconds = cost(r.rank, ins)
    r.first = r.clock if r.first is None else r.first
    r.events.append((ins, r.clock, r.clock + seconds))
    r.clock += seconds
    r.busy += seconds
    return True


def _check_ready(r: _Rank, ins, unit, stage: int, last: int) -> None:
    if isinstance(ins, S.Forward):
        if stage > 0 and ("act", ins.mb, stage) not in r.got:
            raise ScheduleError(f"{r.where(ins)}: forward before its activation was received")
        if unit in r.fwd:
            raise ScheduleError(f"{r.where(ins)}: micro-batch forwarded twice")
        r.fwd.add(unit)
        r.in_flight += 1
        r.peak = max(r.peak, r.in_flight)
    elif isinstance(ins, (S.Backward, S.BackwardInput)):
        if unit not in r.fwd:
            raise ScheduleError(f"{r.where(ins)}: backward before forward")
        if stage < last and ("grad", ins.mb, stage) not in r.got:
            raise ScheduleError(f"{r.where(ins)}: backward before its gradient was received")
        if unit in r.bwd:
            raise ScheduleError(f"{r.where(ins)}: micro-batch backward twice")
        r.bwd.add(unit)
        if isinstance(ins, S.Backward):
            r.wgt.add(unit)
            r.in_flight -= 1
    elif isinstance(ins, S.BackwardWeight):
        if unit not in r.bwd or unit in r.wgt:
            raise ScheduleError(f"{r.where(ins)}: W needs exactly one earlier B")
        r.wgt.add(unit)
        r.in_flight -= 1  # W is the last use of the stashed activations
    else:
        raise ScheduleError(f"{r.where(ins)}: not an instruction")


def _check_complete(ranks, mailbox, m: int, v: int, p: int) -> None:
    lost = [key for key, when in mailbox.items() if when is not None]
    if lost:
        raise ScheduleError(f"messages sent but never received: {sorted(lost)[:8]}")
    want = {(mb, c) for mb in range(m) for c in range(v)}
    for r in ranks:
        for what, done in (("forward", r.fwd), ("backward", r.bwd), ("weight grad", r.wgt)):
            if done != want:
                missing = sorted(want - done)[:8]
                raise ScheduleError(f"rank {r.rank} never ran {what} of (mb, chunk) {missing}")
