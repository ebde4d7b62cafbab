"""`minipar tour`: minipar's own steps end to end, and how the lessons' steps plug in."""

import argparse
import importlib.machinery
import subprocess
import sys
import time
import types

import pytest
from conftest import warm_python

from minipar.cli import tour


@pytest.mark.slow  # CI's long checks only (MINIPAR_EXTENDED=1)
@pytest.mark.own_job
def test_quick_tour_runs_every_core_step():
    start = time.monotonic()
    cmd = warm_python(["-m", "minipar", "tour", "--quick", "--no-lessons"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    seconds = time.monotonic() - start
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "minipar can run here" in out
    assert "ping-pong between rank 0 and rank 1" in out and "16 MiB" not in out  # quick sizes
    assert out.count("ABCD") == 4  # every rank of the ring ended with every letter
    for algorithm in ("ring", "tree", "recursive_doubling"):
        assert f"│ {algorithm} " in out
    assert "all_reduce of 4.0 MiB on 4 ranks" in out
    assert "WRONG SUM" not in out
    for step in ("doctor", "ping-pong", "ring-shift", "all-reduce"):
        assert f"│ {step} " in out and "FAILED" not in out
    assert seconds < 90, f"the quick tour took {seconds:.0f} s"  # ~8 s on 2 idle cores


def test_list_names_the_steps(capsys):
    assert tour.main(_args(list=True, no_lessons=True)) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == [
        "doctor",
        "ping-pong",
        "ring-shift",
        "all-reduce",
    ]


def test_the_all_reduce_step_counts_what_the_demo_runs(capsys):
    """Issue 56: the step said "six algorithms" over a table of seven (hierarchical came)."""
    import minipar

    runs = [a for a in minipar.algorithms("all_reduce") if a != "auto"]  # the demo's own list
    word = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}[len(runs)]
    assert tour.main(_args(list=True, no_lessons=True)) == 0
    assert f"All-reduce: {word} algorithms, one answer" in capsys.readouterr().out
    step = next(s for s in tour.core_steps() if s.name == "all-reduce")
    assert f"computed {word} ways" in step.text


def test_unknown_step_is_an_error(capsys):
    assert tour.main(_args(only=["nope"], no_lessons=True)) == 2
    assert "no step named nope" in capsys.readouterr().out


# -- lessons plug in through minipar.cli.lesson.tour_steps() ------------------------------------


def _args(**kw):
    base = dict(quick=True, no_lessons=False, only=None, list=False, timeout=60)
    return argparse.Namespace(**{**base, **kw})


@pytest.fixture
def fake_lessons(monkeypatch):
    """A stand-in minipar.cli.lesson whose tour_steps() returns every kind of item."""
    calls = []

    def one():
        """Lesson one: the cost model"""
        calls.append("one")

    def two(quick):
        calls.append(("two", quick))
        return 0

    def broken():
        raise RuntimeError("lesson three is broken")

    module = types.ModuleType("minipar.cli.lesson")
    module.__spec__ = importlib.machinery.ModuleSpec("minipar.cli.lesson", None)
    module.tour_steps = lambda: [
        one,
        ("Lesson two", two),
        ("Lesson three", broken),
        ("Lesson four", [sys.executable, "-c", "print('four ran')"]),
        ("Lesson five", [sys.executable, "-c", "raise SystemExit(3)"]),
    ]
    monkeypatch.setattr(tour, "lesson", module)
    return calls


def test_lesson_items_become_steps(fake_lessons):
    steps = tour.lesson_steps()
    assert [s.title for s in steps] == [
        "Lesson one: the cost model",
        "Lesson two",
        "Lesson three",
        "Lesson four",
        "Lesson five",
    ]
    assert [s.name for s in steps] == [f"lesson-{i}" for i in range(1, 6)]


def test_lesson_steps_run_and_failures_are_counted(fake_lessons, capfd):
    status = tour.main(_args(only=["lesson"]))
    out = capfd.readouterr().out
    assert status == 1  # lessons three and five failed
    assert fake_lessons == ["one", ("two", True)]  # quick is passed to those that take it
    assert "four ran" in out and "lesson three is broken" in out
    rows = [line for line in out.splitlines() if "│ lesson-" in line]
    assert [("passed" in r) for r in rows] == [True, True, False, True, False]


def test_each_step_ends_with_a_progress_line(fake_lessons, capfd):
    """The tour took two minutes on a busy machine with no sign of where: after each step (a
    lesson each) a line says its time and the tour's time so far."""
    assert tour.main(_args(only=["lesson-1", "lesson-2", "lesson-5"])) == 1
    out = capfd.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(lines) == 3, out
    for number, (line, name) in enumerate(zip(lines, ("lesson-1", "lesson-2", "lesson-5")), 1):
        assert line.startswith(f"step {number}/3 {name}: "), line
        assert " s since the tour began" in line and " in " in line, line
    assert "passed in" in lines[0] and "FAILED in" in lines[2]


def test_passed_semantics():
    assert tour.passed(None) and tour.passed(True) and tour.passed(0)
    assert not tour.passed(False) and not tour.passed(1) and not tour.passed("0")


def test_bad_item_is_a_type_error():
    with pytest.raises(TypeError, match="cannot run"):
        tour.as_step(42, 1)
