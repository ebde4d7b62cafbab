"""Claim records and their verdicts (minipar/course/claims.py): a miss without a measured cause
fails, a busy machine's timings are not judged while its bytes still are, and a value no
machine can produce is refused. Plain data: no ranks."""

import json
import math

import pytest

from minipar.course import claims
from minipar.course.claims import EXACT, Claim, Load, judge, relative

QUIET = Load(cores=2, before=0.1, during=0.2)
BUSY = Load(cores=2, before=0.3, during=3.5)  # 3.5 runnable besides the lesson's own ranks


def timing(predicted, measured, **fields):
    return Claim("04", "ring all-reduce of 8 MiB", predicted, measured, "s", relative(0.25),
                 "time", **fields)  # fmt: skip


def test_within_tolerance_passes_and_the_tolerance_is_the_stated_one():
    assert judge(timing(1e-3, 1.24e-3), QUIET).verdict == "within"  # 24% < 25%
    assert judge(timing(1e-3, 0.76e-3), QUIET).verdict == "within"
    assert judge(timing(1e-3, 1.26e-3), QUIET).verdict == "outside"  # 26% > 25%
    assert str(relative(0.25)) == "+-25%"


def test_a_miss_without_a_measured_cause_fails():
    c = judge(timing(1e-3, 3e-3), QUIET)
    assert c.verdict == "outside" and c.failed and c.cause == ""


def test_a_miss_with_a_measured_cause_is_explained_and_says_it():
    cause = "4 ranks on 2 cores (oversubscribed)"
    c = judge(timing(1e-3, 3e-3), QUIET, causes=["", cause])
    assert c.verdict == "explained" and not c.failed and c.cause == cause
    assert cause in claims.verdict_line(c)


def test_a_busy_machine_leaves_timings_not_judged_but_judges_bytes():
    c = judge(timing(1e-3, 9e-3), BUSY)
    assert c.verdict == "not judged" and not c.failed
    assert "load-sensitive" in c.cause and "3.50" in c.cause
    wrong_bytes = Claim("04", "bytes sent", 3 << 20, (3 << 20) + 4, "B", EXACT, "bytes")
    assert judge(wrong_bytes, BUSY).verdict == "outside"  # bytes never hide behind the load
    right_steps = Claim("04", "steps", 6, 6, "steps", EXACT, "steps")
    assert judge(right_steps, BUSY).verdict == "within"


def test_load_before_the_run_counts_too():
    assert Load(2, before=2.5, during=0.0).busy
    assert not Load(2, before=2.0, during=1.9).busy  # at the core count: not above it


def test_load_now_leaves_out_the_lessons_own_ranks():
    import os

    own = 10**6  # more ranks than any load average: nothing left for others
    assert Load.now(2, own_ranks=own).during == 0.0
    assert Load.now(2).during == pytest.approx(os.getloadavg()[0], abs=2.0)


@pytest.mark.parametrize(
    "measured,unit,bound",
    [
        (-66.1e-6, "s", (-math.inf, math.inf)),  # lesson 04's fitted negative latency
        (float("nan"), "s", (-math.inf, math.inf)),
        (20e9, "B/s", (0, 16e9)),  # above the roofline
        (1e-3, "s", (2e-3, math.inf)),  # faster than the floor memory allows
    ],
)
def test_impossible_values_are_refused_never_passed(measured, unit, bound):
    c = judge(Claim("04", "x", measured, measured, unit, relative(0.5), "time", bound=bound),
              QUIET)  # fmt: skip
    assert c.verdict == "impossible" and c.failed, c
    assert "PASS" not in claims.verdict_line(c)


def test_a_negative_time_is_impossible_even_on_a_busy_machine():
    c = judge(timing(1e-3, -1e-6), BUSY)
    assert c.verdict == "impossible"


def test_exact_and_one_sided_tolerances():
    assert EXACT.holds(6, 6) and not EXACT.holds(6, 7)
    assert claims.at_least().holds(1.0, 1.2) and not claims.at_least().holds(1.0, 0.9)
    assert claims.at_most(0.1).holds(1.0, 1.09) and not claims.at_most(0.1).holds(1.0, 1.11)


def test_records_are_json_and_tally_counts_verdicts():
    made = [
        judge(timing(1e-3, 1e-3), QUIET),
        judge(timing(1e-3, 5e-3), QUIET, causes=["per-step software cost 40 us x 6 steps"]),
        judge(timing(1e-3, -1.0), QUIET),
        judge(timing(1e-3, 5e-3), BUSY),
    ]
    records = json.loads(json.dumps([c.record() for c in made]))
    for r in records:
        assert {"lesson", "claim", "predicted", "measured", "unit", "tolerance", "verdict",
                "cause"} <= set(r)  # fmt: skip
    assert claims.tally(records) == {"claims": 4, "within": 1, "explained": 1, "outside": 0,
                                     "impossible": 1, "not judged": 1}  # fmt: skip


def test_a_kind_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match="'speed'"):
        judge(Claim("04", "x", 1.0, 1.0, "s", relative(0.1), "speed"), QUIET)
