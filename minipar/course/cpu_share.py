"""Did the run get its cores? What a lesson's own processes got of the CPU while it measured,
against the wall time and the machine's total CPU use over the same window (/proc/stat).

    start = Snapshot.now(own_cpu=time.process_time())    # every rank its own CPU seconds
    ...                                                   # the lesson measures
    end = Snapshot.now(own_cpu=time.process_time())
    share = Share.between(start, end, cores=2, ranks=2)   # own CPU summed over the ranks
    share.stolen       # CPU seconds the ranks wanted and others used: 0.0 on a quiet machine
    share.lost         # that as a fraction of what the ranks wanted (0.5 beside two busy loops)
    share.busy         # lost > BUSY: the run did not get its cores

A lesson's ranks poll MPI while they wait, so each wants a whole core: min(ranks, cores) x wall
CPU seconds. What they got is their own CPU time; what other processes used is the machine's
non-idle time less theirs. The CPU the ranks did not get because others used it is the smaller
of the two shortfalls (what they wanted less what they got, what the others used), so a rank
that sleeps on a quiet machine loses nothing. The load average is no measure of this: it lags
by a minute (a lesson run just after another would be judged by its predecessor's ranks) and
counts a process that waits as much as one that computes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

BUSY = 0.10  # the run lost more than this share of the CPU it wanted: it did not get its cores
STAT = "/proc/stat"


def machine_seconds(text: str, hz: float) -> tuple[float, float]:
    """(non-idle, all) CPU seconds over every core since boot, from /proc/stat's text: the
    first line's user nice system idle iowait irq softirq steal (guest time is inside user)."""
    first = text.splitlines()[0].split()
    if not first or first[0] != "cpu" or len(first) < 5:
        raise ValueError(f"not /proc/stat's first line: {text.splitlines()[0]!r}")
    ticks = [int(x) for x in first[1:9]]
    idle = ticks[3] + ticks[4]  # idle + iowait: the core had nothing to run
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


@dataclass(frozen=True)
class Snapshot:
    """One moment: the wall clock, the machine's CPU seconds (None where there is no
    /proc/stat) and the CPU seconds of the run's own processes (summed over its ranks)."""

    wall: float
    machine: float | None
    own: float

    @classmethod
    def now(cls, own_cpu: float, stat: str = STAT) -> Snapshot:
        try:
            with open(stat) as f:
                busy, _ = machine_seconds(f.read(), os.sysconf("SC_CLK_TCK"))
        except (OSError, ValueError):
            busy = None
        return cls(time.perf_counter(), busy, own_cpu)


@dataclass(frozen=True)
class Share:
    """The CPU over one window: `wall` seconds, the ranks' own CPU seconds, the machine's
    (every process's, the ranks' included; None where unknown), on `cores` cores."""

    cores: int
    ranks: int
    wall: float
    own: float
    machine: float | None

    @classmethod
    def between(cls, start: Snapshot, end: Snapshot, cores: int, ranks: int) -> Share:
        machine = None
        if start.machine is not None and end.machine is not None:
            machine = end.machine - start.machine
        return cls(cores, ranks, end.wall - start.wall, end.own - start.own, machine)

    @property
    def wanted(self) -> float:
        """CPU seconds the ranks would use with a core each (polling MPI while they wait)."""
        return min(self.ranks, self.cores) * self.wall

    @property
    def others(self) -> float:
        """CPU seconds other processes used in the window (0 where /proc/stat is missing)."""
        return 0.0 if self.machine is None else max(0.0, self.machine - self.own)

    @property
    def stolen(self) -> float:
        """CPU seconds the ranks wanted and did not get because other processes used them."""
        return min(self.others, max(0.0, self.wanted - self.own))

    @property
    def lost(self) -> float:
        """The stolen seconds as a share of what the ranks wanted (0 to 1)."""
        return self.stolen / self.wanted if self.wanted > 0 else 0.0

    @property
    def busy(self) -> bool:
        return self.lost > BUSY

    def describe(self) -> str:
        if self.machine is None:
            return "no /proc/stat here: the CPU the ranks got is not known"
        ranks = f"{self.ranks} rank{'' if self.ranks == 1 else 's'}"
        return (
            f"the lesson's {ranks} got {self.own / self.wall:.2f} of {self.cores} "
            f"cores over {self.wall:.2f} s; other processes took {self.lost:.0%} of the CPU "
            f"the ranks wanted"
        )

    def record(self) -> dict:
        return {"cores": self.cores, "ranks": self.ranks, "wall_s": self.wall,
                "own_cpu_s": self.own, "machine_cpu_s": self.machine,
                "stolen_cpu_s": self.stolen, "lost": self.lost, "busy": self.busy}  # fmt: skip
