"""Claim records and their verdicts (minipar/course/claims.py): a miss without a measured cause
fails, a run that did not get its cores leaves its absolute times not judged while its ratios,
bytes and values still are, a load is no cause where the run had its cores, and a value no
machine can produce is refused. Plain data: no ranks."""

import json
import math

import pytest

from minipar.course import claims
from minipar.course.claims import EXACT, Claim, judge, relative
from minipar.course.cpu_share import Share

# 2 ranks on 2 cores for 1 s: they got 1.9 CPU seconds, other processes 0.05
QUIET = Share(cores=2, ranks=2, wall=1.0, own=1.9, machine=1.95)
# beside two busy loops: the ranks got 1.0 of the 2.0 they wanted, others took the rest
BUSY = Share(cores=2, ranks=2, wall=1.0, own=1.0, machine=2.0)


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


def ratio(predicted, ratios, **fields):
    return Claim("04", "ring / MPI_Allreduce", predicted, sorted(ratios)[len(ratios) // 2], "x",
                 relative(0.25), "time", spread=(min(ratios), sorted(ratios)[len(ratios) // 2],
                 max(ratios)), reference="MPI_Allreduce, alternated", **fields)  # fmt: skip


def test_a_run_without_its_cores_leaves_absolute_times_not_judged_but_judges_the_rest():
    c = judge(timing(1e-3, 9e-3), BUSY)
    assert c.verdict == "not judged" and not c.failed
    assert "did not get its cores" in c.cause and "50%" in c.cause and c.cpu_lost == 0.5
    wrong_bytes = Claim("04", "bytes sent", 3 << 20, (3 << 20) + 4, "B", EXACT, "bytes")
    assert judge(wrong_bytes, BUSY).verdict == "outside"  # bytes never hide behind the load
    right_steps = Claim("04", "steps", 6, 6, "steps", EXACT, "steps")
    assert judge(right_steps, BUSY).verdict == "within"
    assert judge(ratio(1.2, [1.1, 1.2, 1.3]), BUSY).verdict == "within"  # a ratio is judged
    assert judge(ratio(1.2, [2.0, 2.1, 2.2]), BUSY).verdict == "outside"  # steady: no excuse


def test_a_load_is_no_cause_where_the_run_had_its_cores():
    c = judge(timing(1e-3, 3e-3), QUIET)
    assert QUIET.others > 0 and not QUIET.busy  # others ran, on the cores the ranks left
    assert c.verdict == "outside" and c.cause == "" and c.failed


def test_a_ratio_whose_pairs_moved_on_a_busy_run_is_explained_by_the_measured_share():
    c = judge(ratio(1.2, [0.9, 2.0, 2.4]), BUSY)  # the pairs ranged 2.7x: the load moved
    assert c.verdict == "explained" and "0.9 to 2.4" in c.cause and "50%" in c.cause
    assert judge(ratio(1.2, [0.9, 2.0, 2.4]), QUIET).verdict == "outside"  # no load to blame


def test_timings_shown_only_are_never_judged():
    assert judge(timing(1e-3, 1e-3), QUIET, shown_only=True).verdict == "not judged"
    assert judge(ratio(1.2, [5.0]), QUIET, shown_only=True).verdict == "not judged"


def test_alternate_runs_a_and_b_in_turn_and_a_steady_load_cancels():
    order, clock = [], iter(range(1, 100))

    def a():
        order.append("a")
        return 3.0 * next(clock)  # a load that grows slows both alike

    def b():
        order.append("b")
        return 2.0 * next(clock)

    pairs = claims.alternate(a, b, 3)
    assert order == ["a", "b"] * 3
    assert pairs.ratios == pytest.approx((3 * 1 / (2 * 2), 3 * 3 / (2 * 4), 3 * 5 / (2 * 6)))
    assert pairs.ratio == pytest.approx(9 / 8) and pairs.spread[0] == pytest.approx(0.75)
    assert pairs.seconds == (9.0, 8.0)
    with pytest.raises(ValueError, match="at least one pair, not 0"):
        claims.alternate(a, b, 0)


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


def test_timing_tally_counts_judged_and_within_timing_claims_only():
    made = [
        judge(timing(1e-3, 1e-3), QUIET),  # within
        judge(timing(1e-3, 1e-3), BUSY),  # not judged
        judge(ratio(1.2, [1.1, 1.2, 1.3]), BUSY),  # within, a ratio
        judge(ratio(1.2, [0.9, 2.0, 2.4]), BUSY),  # explained, a ratio
        judge(Claim("04", "steps", 6, 6, "steps", EXACT, "steps"), BUSY),  # not timing
    ]
    got = claims.timing_tally([c.record() for c in made])
    assert got == {"timing": 4, "judged": 3, "within": 2, "explained": 1, "ratios": 2}


def test_a_kind_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match="'speed'"):
        judge(Claim("04", "x", 1.0, 1.0, "s", relative(0.1), "speed"), QUIET)
