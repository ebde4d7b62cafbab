"""Claims: a lesson's predict-then-measure pairs as data, each judged against a stated tolerance.

    load = Load.now(cores=2, own_ranks=4)          # the machine's business, read when it starts
    c = judge(Claim("01", "ping-pong latency", predicted=20e-6, measured=31e-6, unit="s",
                    tolerance=relative(0.5), kind="time"), load, causes=["4 ranks on 2 cores"])
    c.verdict -> "explained"; c.cause -> "4 ranks on 2 cores"; c.failed -> False

A claim is one row of a record: the lesson, what is claimed, the prediction, the measurement,
the unit, the tolerance, the verdict and the measured cause. The verdicts:

    within       the measurement is within the tolerance of the prediction
    explained    outside it, with a cause the lesson measured (more ranks than cores, the load
                 average during the run, the per-step software cost, TCP's window, ...)
    outside      outside it and nothing measured explains it: the lesson fails
    impossible   a value no machine can produce (a negative time, a bandwidth above the
                 roofline, not a number): the lesson fails, never passes
    not judged   a timing claim on a machine busier than its cores ("load-sensitive"):
                 shown, not judged; bytes, steps and values are always judged

The printed verdict lines, the `--json` records and the numbers in lessons/*.md all come from
these records (scripts/lesson_numbers.py), so they cannot disagree.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace

from minipar.course.formats import fmt_value

KINDS = ("time", "bytes", "steps", "value")  # only "time" is load-sensitive
VERDICTS = ("within", "explained", "outside", "impossible", "not judged")
FAILING = ("outside", "impossible")


@dataclass(frozen=True)
class Tolerance:
    """How close is close enough. kind: "relative" (|measured/predicted - 1| <= value),
    "absolute" (|measured - predicted| <= value, e.g. a bubble fraction within 0.1), "exact"
    (equal), "at_least" / "at_most" (one-sided, measured >= / <= predicted x (1 -/+ value))."""

    kind: str
    value: float = 0.0

    def holds(self, predicted, measured) -> bool:
        if self.kind == "exact":
            return measured == predicted
        if self.kind == "relative":
            if predicted == 0:
                return measured == 0
            return abs(measured / predicted - 1) <= self.value
        if self.kind == "absolute":
            return abs(measured - predicted) <= self.value
        if self.kind == "at_least":
            return measured >= predicted * (1 - self.value)
        if self.kind == "at_most":
            return measured <= predicted * (1 + self.value)
        raise ValueError(f"unknown tolerance kind {self.kind!r}")

    def __str__(self) -> str:
        slack = f" - {self.value:.0%}" if self.value else ""
        return {
            "exact": "exact",
            "relative": f"+-{self.value:.0%}",
            "absolute": f"+-{self.value:g}",
            "at_least": f">= predicted{slack}",
            "at_most": f"<= predicted{slack.replace('-', '+')}",
        }[self.kind]


def relative(fraction: float) -> Tolerance:
    """+-fraction of the prediction: 0.25 for bandwidth-bound times, 0.5 for latency-bound."""
    return Tolerance("relative", fraction)


EXACT = Tolerance("exact")
BANDWIDTH_BOUND = relative(0.25)
LATENCY_BOUND = relative(0.5)


def absolute(margin: float) -> Tolerance:
    """+-margin in the claim's own unit (a fraction's points, a count)."""
    return Tolerance("absolute", margin)


def at_least(slack: float = 0.0) -> Tolerance:
    return Tolerance("at_least", slack)


def at_most(slack: float = 0.0) -> Tolerance:
    return Tolerance("at_most", slack)


@dataclass(frozen=True)
class Load:
    """The machine's business: its cores, the load average before the lesson's ranks started
    and the highest seen while it ran, less the lesson's own ranks (which keep their cores busy
    polling MPI, so they are not someone else's load)."""

    cores: int
    before: float
    during: float = 0.0

    @classmethod
    def now(cls, cores: int, own_ranks: int = 0, before: float | None = None) -> Load:
        seen = max(0.0, os.getloadavg()[0] - own_ranks)
        return cls(cores, seen if before is None else before, seen)

    def sampled(self, own_ranks: int) -> Load:
        """This load with the load average now counted into `during`."""
        seen = max(0.0, os.getloadavg()[0] - own_ranks)
        return replace(self, during=max(self.during, seen))

    @property
    def busy(self) -> bool:
        """Load above the core count before or during the run: timings are not judged."""
        return max(self.before, self.during) > self.cores

    def describe(self) -> str:
        return (
            f"load average {max(self.before, self.during):.2f} besides the lesson's ranks "
            f"(before {self.before:.2f}) on {self.cores} cores"
        )


@dataclass(frozen=True)
class Claim:
    """One predict-then-measure pair. `bound` is the physically possible range of the measured
    value (a time >= 0, a time >= the roofline's floor, a bandwidth <= the roofline); `spread`
    the (min, median, max) of the repeats; `basis` what the prediction rests on ("this machine,
    calibrated", "preset H100", "formula")."""

    lesson: str
    claim: str
    predicted: float | int | bool | None
    measured: float | int | bool | None
    unit: str = ""
    tolerance: Tolerance = BANDWIDTH_BOUND
    kind: str = "time"
    bound: tuple[float, float] = (-math.inf, math.inf)
    spread: tuple[float, float, float] | None = None
    basis: str = ""
    verdict: str = ""
    cause: str = ""
    holds: bool | None = None  # within the tolerance, whatever the verdict (None: impossible)
    causes_seen: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    def record(self) -> dict:
        """The claim as JSON-ready data (the tolerance as its text, its kind and value)."""
        out = asdict(self)
        out["tolerance"] = str(self.tolerance)
        out["tolerance_kind"], out["tolerance_value"] = self.tolerance.kind, self.tolerance.value
        out["bound"] = [None if math.isinf(b) else b for b in self.bound]
        out.pop("causes_seen")
        return out


def impossible(claim: Claim) -> str:
    """Why the measured value cannot be real, or "" if it can."""
    m = claim.measured
    if m is None or isinstance(m, bool):
        return ""
    if not math.isfinite(m):
        return f"not a finite number ({m})"
    if claim.unit in ("s", "B/s", "B", "steps") and m < 0:
        return f"negative ({fmt_value(m, claim.unit)})"
    lo, hi = claim.bound
    if m < lo:
        return f"below the physical bound {fmt_value(lo, claim.unit)}"
    if m > hi:
        return f"above the physical bound {fmt_value(hi, claim.unit)}"
    return ""


def judge(claim: Claim, load: Load | None = None, causes=()) -> Claim:
    """The claim with its verdict. `causes`: what the lesson measured that can explain a miss
    (only non-empty strings count); a timing claim also takes the load as a cause."""
    if claim.kind not in KINDS:
        raise ValueError(f"claim kind {claim.kind!r} is none of {KINDS}")
    why = impossible(claim)
    timing = claim.kind == "time"
    if not why and claim.predicted is not None:
        claim = replace(claim, holds=bool(claim.tolerance.holds(claim.predicted, claim.measured)))
    if why:
        busy = timing and load is not None and load.busy and math.isfinite(claim.measured)
        if busy and claim.measured >= 0:  # the bound itself was measured on a busy machine
            return replace(claim, verdict="not judged", cause=f"{why}; {load.describe()}")
        return replace(claim, verdict="impossible", cause=why)
    if timing and load is not None and load.busy:
        held = "would be within" if claim.holds else "would be outside"
        seen = "; ".join(c for c in causes if c) if not claim.holds else ""
        return replace(
            claim,
            verdict="not judged",
            cause=f"load-sensitive ({held}): {load.describe()}" + (f"; {seen}" if seen else ""),
        )
    if claim.predicted is None or claim.holds:
        return replace(claim, verdict="within", cause="")
    found = [c for c in causes if c]
    if timing and load is not None and max(load.before, load.during) >= 0.5:
        found.append(load.describe())
    if found:
        return replace(claim, verdict="explained", cause="; ".join(found), causes_seen=found)
    return replace(claim, verdict="outside", cause="")


def environment_causes(ranks: int, cores: int) -> list[str]:
    """What the environment alone explains about a slow time: more ranks than cores."""
    if ranks > cores:
        return [f"{ranks} ranks on {cores} cores (oversubscribed: ranks wait for a core)"]
    return []


def verdict_line(claim: Claim) -> str:
    """One printed line (rich markup) made from the record alone."""
    mark = {
        "within": "[green]PASS[/]",
        "explained": "[yellow]OUTSIDE, explained[/]",
        "outside": "[bold red]FAIL[/]",
        "impossible": "[bold red]FAIL impossible[/]",
        "not judged": "[dim]NOT JUDGED[/]",
    }[claim.verdict]
    if isinstance(claim.measured, bool) and isinstance(claim.predicted, bool):
        shown = ""  # a check: the claim's words say what held
    elif claim.predicted is None:
        shown = f"measured {fmt_value(claim.measured, claim.unit)}"
    else:
        shown = (
            f"predicted {fmt_value(claim.predicted, claim.unit)}, "
            f"measured {fmt_value(claim.measured, claim.unit)} ({claim.tolerance})"
        )
    line = f"  {mark}  {claim.claim}" + (f": {shown}" if shown else "")
    if claim.spread:
        lo, med, hi = claim.spread
        line += f" [dim][min {fmt_value(lo, claim.unit)}, max {fmt_value(hi, claim.unit)}][/]"
    if claim.cause:
        label = "not judged" if claim.verdict == "not judged" else "cause"
        line += f"\n        [dim]{label}: {claim.cause}[/]"
    return line


def tally(records: list[dict]) -> dict:
    """claims, within, explained, outside, impossible, not judged: counts over records."""
    out = {"claims": len(records)}
    for verdict in VERDICTS:
        out[verdict] = sum(r["verdict"] == verdict for r in records)
    return out
