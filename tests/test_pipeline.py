"""Pipeline parallelism: schedules checked with no communication, then on real ranks.

The verifier runs every schedule for p = 2..8 and m = 1..16 in-process (no MPI); the rank
suite (tests/ranks/pipeline.py) runs once per world size, 2 and 4.
"""

import os

import pytest
from conftest import ranks_suite

from minipar.parallel.pipeline import schedules as S
from minipar.parallel.pipeline import verify as V
from minipar.testing import harness

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
SUITE = ranks_suite("pipeline.py")
LAYOUTS = [(n, p, m, v) for n in S.SCHEDULES for p in range(2, 9) for m in range(1, 17)
           for v in (((2, 3) if EXTENDED else (2,)) if n == "interleaved" else (1,))]  # fmt: skip


@pytest.mark.parametrize("name", sorted(S.SCHEDULES))
def test_verifier_every_layout(name):
    """Sound for every p, m (m < p included); bubble and memory match theory where it applies."""
    for n, p, m, v in LAYOUTS:
        if n != name:
            continue
        report = V.verify(S.program(n, p, m, v))
        where = (n, p, m, v)
        formula_holds = {"interleaved": m % p == 0, "zb-h1": m >= p}.get(n, True)
        if formula_holds:
            assert report.bubble_fraction == pytest.approx(V.predicted_bubble(n, p, m, v)), where
        if n == "gpipe":
            assert report.peak_in_flight == [m] * p, where
        if n == "1f1b":
            assert report.peak_in_flight == [min(p - r, m) for r in range(p)], where
        if n == "zb-h1":
            assert max(report.peak_in_flight) <= min(p, m), where
            assert report.bubble_fraction <= V.verify(S.program("1f1b", p, m)).bubble_fraction


def test_verifier_catches_deadlock():
    both_wait = [[S.RecvGrad(0), S.Forward(0), S.SendActivation(0), S.Backward(0)],
                 [S.RecvActivation(0), S.Forward(0), S.Backward(0), S.SendGrad(0)]]  # fmt: skip
    with pytest.raises(V.ScheduleError, match="deadlock"):
        V.verify(both_wait)


def test_verifier_catches_lost_message_and_bad_order():
    program = S.program("1f1b", 2, 2)
    lost = [program[0], [i for i in program[1] if i != S.RecvActivation(1)]]
    with pytest.raises(V.ScheduleError, match="forward before its activation"):
        V.verify(lost)
    extra = [program[0] + [S.SendActivation(1)], program[1]]
    with pytest.raises(V.ScheduleError, match="sent twice"):
        V.verify(extra)
    backward_first = [[S.Backward(0), S.Forward(0)]]
    with pytest.raises(V.ScheduleError, match="backward before forward"):
        V.verify(backward_first)


def test_unknown_schedule_and_bad_counts():
    with pytest.raises(ValueError, match="'2f2b'"):
        S.program("2f2b", 2, 4)
    with pytest.raises(ValueError, match="n_microbatches"):
        S.program("1f1b", 2, 0)
    with pytest.raises(ValueError, match="virtual_stages=2"):
        S.program("1f1b", 2, 4, 2)


def test_split_shares_layers_and_balances():
    import torch.nn as nn

    from minipar.parallel.pipeline import split

    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.Linear(64, 4))
    stages = split(model, 2)
    assert [len(s) for s in stages] == [2, 2]  # 320 + 0 | 4160 + 260 beats 320 + 4160 | 260?
    assert all(a is b for a, b in zip([m for s in stages for m in s], model))
    assert [len(s) for s in split(model, 3, balance=[1, 1, 2])] == [1, 1, 2]
    with pytest.raises(ValueError, match="4 layers into 5 stages"):
        split(model, 5)
    with pytest.raises(ValueError, match="sums to 3"):
        split(model, 2, balance=[1, 2])


@pytest.mark.parametrize("size,name", harness.params(SUITE, [2, 4]))
def test_pipeline_ranks(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_timeline_reads_without_colour(name):
    """Issue 56: forward and backward were digits told apart by colour alone (lost when piped).
    Without colour each rank's row names every task, kind and micro-batch, in the order the
    verifier scheduled it; '-' and '.' tell a task going on from idle."""
    import re

    from minipar.parallel.pipeline import Timeline

    report = V.verify(S.program(name, 4, 8))
    letter = {"Forward": "F", "Backward": "B", "BackwardInput": "b", "BackwardWeight": "w"}
    text = Timeline.simulated(report).text(width=240).plain  # room for two slots a task
    rows = [line.split(" ", 2)[2].rsplit("  bubble", 1)[0] for line in text.splitlines()[:4]]
    for rank, row in enumerate(rows):
        order = sorted(report.events[rank], key=lambda event: event[1])
        want = [f"{letter[type(ins).__name__]}{ins.mb}" for ins, _, _ in order]
        assert re.findall(r"[FBbw]\d", row) == want, (rank, row)
        assert set(row) <= set("FBbw0123456789-."), row
    assert "F3 micro-batch 3's forward" in text and "w weight grad" in text


def test_timeline_draws_what_the_verifier_predicts(tmp_path):
    from minipar.parallel.pipeline import Timeline

    report = V.verify(S.program("zb-h1", 4, 8))
    timeline = Timeline.simulated(report)
    assert timeline.bubble_fraction == pytest.approx(report.bubble_fraction)
    text = timeline.text(width=54).plain
    rows = [line for line in text.splitlines() if line.startswith("rank ")]
    assert len(rows) == 4 and all("bubble" in row for row in rows)
    assert rows[3][7 + 52 :].startswith("w7")  # the last rank's last slots: micro-batch 7's W
    pytest.importorskip("matplotlib")
    timeline.save_png(str(tmp_path / "zb.png"))
    assert (tmp_path / "zb.png").stat().st_size > 1000
