"""Claims: a lesson's predict-then-measure pairs as data, each judged against a stated tolerance.

    pairs = alternate(lambda: ring(16 << 20), lambda: mpi_allreduce(16 << 20), pairs=5)
    c = judge(Claim("04", "ring / MPI_Allreduce at 16 MiB", predicted=1.2, measured=pairs.ratio,
                    unit="x", tolerance=relative(0.25), spread=pairs.spread,
                    reference="MPI_Allreduce of the same bytes, alternated"), share)
    c.verdict -> "within"; c.failed -> False

A claim is one row of a record: the lesson, what is claimed, the prediction, the measurement,
the unit, the tolerance, the verdict and the measured cause. A timing claim is best a ratio
measured in one run: what it measures and a reference, run alternately (ABAB...), the median
of the pairs' ratios against the cost model's ratio, so a load that stays while it runs slows
both alike and cancels; the absolute times stay in the record as information (`seconds`).
The verdicts:

    within       the measurement is within the tolerance of the prediction
    explained    outside it, with a cause the lesson measured (more ranks than cores, the
                 per-step software cost, TCP's window, a load that moved between the pairs of
                 a run that did not get its cores, ...)
    outside      outside it and nothing measured explains it: the lesson fails. A run that had
                 its cores has no load to blame (cpu_share.py)
    impossible   a value no machine can produce (a negative time, a bandwidth above the
                 roofline, not a number): the lesson fails, never passes
    not judged   an absolute time measured while the run did not get its cores (other
                 processes took more than cpu_share.BUSY of the CPU its ranks wanted): shown,
                 not judged. Ratios, bytes, steps and values are judged however busy it was

The printed verdict lines, the `--json` records and the numbers in lessons/*.md all come from
these records (scripts/lesson_numbers.py), so they cannot disagree.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace

from minipar.course.cpu_share import Share
from minipar.course.formats import fmt_value

KINDS = ("time", "bytes", "steps", "value")  # only "time" depends on the CPU the run got
MEASURED_REFERENCE = "measured in this run"  # a basis: the "prediction" is itself a measurement
UNSTEADY = 1.5  # pairs whose ratios range wider than this: the load moved while they ran
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
class Alternated:
    """What a ratio claim measured: pair i ran A (what is claimed) then B (its reference);
    a[i], b[i] their seconds."""

    a: tuple[float, ...]
    b: tuple[float, ...]
    cpu: Share | None = None  # the CPU the run got while the pairs ran (Page.alternate's)

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(x / y for x, y in zip(self.a, self.b))

    @property
    def ratio(self) -> float:
        """The median of the pairs' ratios: the measured value of the claim."""
        return statistics.median(self.ratios)

    @property
    def spread(self) -> tuple[float, float, float]:
        return min(self.ratios), self.ratio, max(self.ratios)

    @property
    def seconds(self) -> tuple[float, float]:
        """The medians of A's and B's times (absolute: information, not judged)."""
        return statistics.median(self.a), statistics.median(self.b)


def alternate(a, b, pairs: int) -> Alternated:
    """Run a() and b() alternately, `pairs` times (ABAB...), each returning the seconds it
    measured. A load that stays while they run slows both alike and cancels in each pair's
    ratio; one that comes and goes shows as a wide spread of the ratios."""
    if pairs < 1:
        raise ValueError(f"alternate needs at least one pair, not {pairs}")
    xs, ys = [], []
    for _ in range(pairs):
        xs.append(float(a()))
        ys.append(float(b()))
    if min(ys) <= 0:
        raise ValueError(f"a reference time must be positive to divide by: {min(ys)}")
    return Alternated(tuple(xs), tuple(ys))


@dataclass(frozen=True)
class Claim:
    """One predict-then-measure pair. `bound` is the physically possible range of the measured
    value (a time >= 0, a time >= the roofline's floor, a bandwidth <= the roofline); `spread`
    the (min, median, max) of the repeats; `basis` what the prediction rests on ("this machine,
    calibrated", "preset H100", "formula"); `reference` what a ratio's denominator ran
    alternately with (a ratio claim, judged on a busy machine too); `seconds` the medians of
    the two (absolute times: information); `cpu_lost` the share of the CPU the ranks wanted
    that other processes took while it was measured."""

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
    reference: str = ""
    seconds: tuple[float, float] | None = None
    cpu_lost: float | None = None
    causes_seen: list[str] = field(default_factory=list)

    @property
    def is_ratio(self) -> bool:
        return self.kind == "time" and bool(self.reference)

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


def judge(claim: Claim, share: Share | None = None, causes=(), shown_only: bool = False) -> Claim:
    """The claim with its verdict. `share`: the CPU the run got while it measured (None:
    unknown, judged as if it had its cores); `causes`: what the lesson measured that can explain
    a miss (only non-empty strings count); `shown_only`: timings are shown, never judged (a
    test's run: timing is a benchmark, not a test)."""
    if claim.kind not in KINDS:
        raise ValueError(f"claim kind {claim.kind!r} is none of {KINDS}")
    why = impossible(claim)
    timing = claim.kind == "time"
    busy = timing and share is not None and share.busy
    if share is not None and timing:
        claim = replace(claim, cpu_lost=share.lost)
    if not why and claim.predicted is not None:
        claim = replace(claim, holds=bool(claim.tolerance.holds(claim.predicted, claim.measured)))
    if why:
        if busy and not claim.is_ratio and math.isfinite(claim.measured) and claim.measured >= 0:
            # the bound itself was measured while others had the cores
            return replace(claim, verdict="not judged", cause=f"{why}; {share.describe()}")
        return replace(claim, verdict="impossible", cause=why)
    if timing and (shown_only or (busy and not claim.is_ratio)):
        held = "would be within" if claim.holds else "would be outside"
        why = "timings shown, not judged here" if shown_only else (
            f"the run did not get its cores: {share.describe()}")  # fmt: skip
        return replace(claim, verdict="not judged", cause=f"{why} ({held})")
    if claim.predicted is None or claim.holds:
        return replace(claim, verdict="within", cause="")
    found = [c for c in causes if c]
    lo, _, hi = claim.spread or (1.0, 1.0, 1.0)
    if busy and claim.is_ratio and lo > 0 and hi / lo > UNSTEADY:
        found.append(f"the load moved between the pairs (ratios {lo:.3g} to {hi:.3g}): "
                     f"{share.describe()}")  # fmt: skip
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
        word = "reference" if claim.basis.startswith(MEASURED_REFERENCE) else "predicted"
        shown = (
            f"{word} {fmt_value(claim.predicted, claim.unit)}, "
            f"measured {fmt_value(claim.measured, claim.unit)} ({claim.tolerance})"
        )
    line = f"  {mark}  {claim.claim}" + (f": {shown}" if shown else "")
    if claim.spread:
        lo, med, hi = claim.spread
        line += f" [dim][min {fmt_value(lo, claim.unit)}, max {fmt_value(hi, claim.unit)}][/]"
    if claim.reference:
        line += f"\n        [dim]against {claim.reference}"
        if claim.seconds:
            line += f" (medians {fmt_value(claim.seconds[0], 's')} / "
            line += f"{fmt_value(claim.seconds[1], 's')})"
        line += "[/]"
    if claim.cause:
        label = "not judged" if claim.verdict == "not judged" else "cause"
        line += f"\n        [dim]{label}: {claim.cause}[/]"
    return line


def timing_tally(records: list[dict]) -> dict:
    """The timing claims alone: how many, judged (not "not judged"), within, and of those
    judged the ones measured as ratios (a reference alternated) and the explained ones."""
    timing = [r for r in records if r["kind"] == "time"]
    judged = [r for r in timing if r["verdict"] != "not judged"]
    return {"timing": len(timing), "judged": len(judged),
            "within": sum(r["verdict"] == "within" for r in judged),
            "explained": sum(r["verdict"] == "explained" for r in judged),
            "ratios": sum(bool(r.get("reference")) for r in timing)}  # fmt: skip


def tally(records: list[dict]) -> dict:
    """claims, within, explained, outside, impossible, not judged: counts over records."""
    out = {"claims": len(records)}
    for verdict in VERDICTS:
        out[verdict] = sum(r["verdict"] == verdict for r in records)
    return out
