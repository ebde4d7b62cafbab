"""The lessons: each runs (quick) and prints its key lines on rank 0 only; each break-it lab
catches its planted bug; every number a lesson's text states is computed by its module. The
lessons run on warm ranks (tests/ranks/lessons.py); lessons 01 and 12 (its --json records
read back) and the labs that break their group on purpose go through `minipar lesson` itself, on
ranks of their own."""

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ranks_suite

from minipar.cli import lesson
from minipar.course.lessons import LESSONS, find
from minipar.testing import harness
from minipar.testing.worker import load_suite

READY = [entry for entry in LESSONS if lesson.exists(entry)]
KEY_LINES = {
    "01": ["Lesson 01", "1120 GB", "needs >= 6 GPUs", "rank-to-rank bandwidth", "Try this"],
    "02": ["Lesson 02", "[60 64 68 72]", "[3 13 23 33]", "all_to_all", "Try this"],
    "03": ["step 5 (all-gather)", "0+1+2+3", "messages", "measured ring", "Try this"],
    "04": ["busbw", "MPI_Allreduce", "roofline", "One copy or two", "hierarchical", "Try this"],
    "05": [
        "exposed comm",
        "25 MB buckets",
        "ZeRO-1 optimizer state",
        "FSDP bytes sent",
        "Try this",
    ],
    "06": ["the column split sends nothing forward", "one all-reduce forward (g)", "ib_ndr"],
    "08": ["dp=2 x tp=2 x pp=2", "tp: bytes sent match", "IB NDR", "★", "Try this"],
    "09": [
        "36.5 GB",
        "cp - 1 K/V blocks forward",
        "load-balanced: every rank the same work",
        "ring and Ulysses save 1/cp",
        "Ulysses: 4 all-to-alls",
        "Try this",
    ],
    "10": [
        "MoE equals DenseMoE",
        "each all-to-all sends the copies routed off-rank",
        "164%",
        "the auxiliary loss evens the load",
        "192 per rank",
        "Try this",
    ],
    "11": [
        "the simulated ring meets the closed form",
        "one ring per NIC: more than 5x",
        "the bubble read off the simulated step is the formula's",
        "0 wrong results at p = 13, 31",
        "Try this",
    ],
    "12": [
        "3.09 h",
        "the scanned best interval is sqrt(2 delta M)'s",
        "an overlapped save costs a step less than a blocking one",
        "Try this",
    ],
    "07": [
        "75.0%",
        "1F1B holds at most p",
        "zero bubble H1",
        "one full-batch backward",
        "Try this",
    ],
}
# claims a lesson's --json records must hold: (kind, tolerance as stated)
RECORDED = {
    "12": {
        "delta 10 s: the scanned best interval is sqrt(2 delta M)'s": ("value", "+-5%"),
        "delta 60 s: the scanned best interval is sqrt(2 delta M)'s": ("value", "+-5%"),
        "delta 300 s: the scanned best interval is sqrt(2 delta M)'s": ("value", "+-5%"),
        "an overlapped save costs a step less than a blocking one (a saving step / a plain one)": (
            "time",
            "<= predicted",
        ),
    },
}
LABS = {
    ("02", "send-first"): "8 MiB: the timeout caught the deadlock",
    ("03", "wrong-chunk"): "caught",
    ("03", "last-bit"): "the bitwise check across ranks catches it",
    ("04", "no-wait"): "the roofline check catches it",
    ("05", "tied-twice"): "the ledger check catches it",
    ("06", "bias-every-rank"): "caught: the planted output is off by exactly (p - 1) x bias",
    ("07", "dp-warmup"): "never synchronised",
    ("09", "forget-rescale"): "caught: with scores in the hundreds exp(lse) overflows",
    ("09", "naive-split"): "caught: ContextStats shows rank 3 doing 4 x rank 0's work",
    ("10", "no-counts"): "caught: minipar's transport refuses the message on every rank",
    ("10", "wrong-group"): "caught: the comparison with the dense twin finds",
}


SUITE = ranks_suite("lessons.py")  # every lesson and lab but those below, on warm ranks
_SUITE = load_suite(SUITE)
OWN_JOB_LABS = _SUITE.OWN_JOB  # labs that leave their group failed on purpose
LAUNCHED = _SUITE.LAUNCHER  # quick runs through `minipar lesson` itself


def test_lesson_05_reads_the_cable_once_a_node_fenced_off_the_step():
    """The node's eth0 counter read once a node, off the step (tests/ranks/lessons.py)."""
    harness.run_suite(SUITE, 2, "mpi").check("cable_fenced")


def test_lesson_01_asks_the_kernel_whether_mpi_can_copy_once():
    """single_copy.cma_works against /proc/PID/mem on 2 ranks (tests/ranks/lessons.py)."""
    harness.run_suite(SUITE, 2, "mpi").check("cma_probe")


def test_reading_another_process_returns_its_bytes_or_none():
    from minipar.course.lessons import single_copy

    buf = np.array([7, 8, 9], np.int64)
    assert single_copy.read_other(os.getpid(), buf.ctypes.data, 16) == buf[:2].tobytes()
    assert single_copy.read_other(2**22 + 12345, buf.ctypes.data, 8) is None  # past pid_max
    out = np.zeros(2, np.int64)
    assert single_copy.read_into(os.getpid(), buf.ctypes.data + 8, out)
    assert out.tolist() == [8, 9]


def outputs(number, name):
    """Every rank's output of a case of the lessons suite, on the lesson's own ranks."""
    result = harness.run_suite(SUITE, find(number).ranks, "mpi")
    result.check(name)
    return [result.ranks[rank][name]["output"] for rank in sorted(result.ranks)]


def run(monkeypatch, number, *, lab=None, json=None):
    """`minipar lesson NN --quick [--break LAB] [--json FILE]`, as a student types it."""
    monkeypatch.setenv("COLUMNS", "120")  # rank 0's tables, unwrapped, so lines can be matched
    # timing claims are a benchmark, not a timed test (tests/ranks/lessons.py): shown only
    monkeypatch.setenv("MINIPAR_TIMING", "shown")
    done = lesson.run_lesson(number, quick=True, lab=lab, timeout=120, capture=True, json=json)
    return done.returncode, done.stdout + done.stderr


def check_quick(number, out):
    for line in KEY_LINES[number]:
        assert line in out, f"lesson {number}: {line!r} missing from:\n{out[-3000:]}"
    assert "FAIL" not in out
    assert out.count("Lesson ") == 1, "only rank 0 prints"


@pytest.mark.parametrize("number", [e.number for e in READY if e.number not in LAUNCHED])
def test_lesson_runs_quick(number):
    rank0, *others = outputs(number, f"quick.{number}")
    check_quick(number, rank0)
    loud = [rank for rank, out in enumerate(others, start=1) if out.strip()]
    assert not loud, f"only rank 0 prints; ranks {loud} did: {others[loud[0] - 1][-2000:]}"


@pytest.mark.own_job
@pytest.mark.parametrize("number", sorted(LAUNCHED))
def test_lesson_command_runs_quick(monkeypatch, tmp_path, number):
    """Under `minipar lesson`, timings shown only (a test is no benchmark): the lesson says so
    first, its timing claims are shown but not judged, its bytes, steps and values are judged;
    the records (--json) hold the same verdicts the lines print, and the CPU the run got."""
    status, out = run(monkeypatch, number, json=tmp_path / "claims.json")
    assert status == 0, out[-3000:]
    check_quick(number, out)
    assert "Timing claims are shown, not judged here" in out
    records = json.loads((tmp_path / "claims.json").read_text())
    cpu = records["cpu"]
    assert cpu["ranks"] == records["ranks"] and cpu["wall_s"] > 0 and 0 <= cpu["lost"] <= 1
    assert cpu["own_cpu_s"] > 0 and "before" in records["load"]
    timing = [c for c in records["claims"] if c["kind"] == "time"]
    others = [c for c in records["claims"] if c["kind"] != "time"]
    assert timing and all(c["verdict"] == "not judged" for c in timing), timing
    assert others and all(c["verdict"] == "within" for c in others), others
    assert out.count("NOT JUDGED") == len(timing) and out.count("PASS") >= len(others)
    rows = {c["claim"]: c for c in records["claims"]}
    for name, (kind, tolerance) in RECORDED.get(number, {}).items():
        assert name in rows, f"lesson {number}: no record {name!r} in {sorted(rows)}"
        assert (rows[name]["kind"], rows[name]["tolerance"]) == (kind, tolerance), rows[name]
        assert rows[name]["predicted"] is not None and rows[name]["measured"] is not None


@pytest.mark.parametrize("number,lab", [key for key in LABS if key not in OWN_JOB_LABS])
def test_break_it_lab_catches_the_bug(number, lab):
    rank0 = outputs(number, f"lab.{number}.{lab}")[0]
    assert LABS[(number, lab)] in rank0, rank0[-3000:]


@pytest.mark.own_job
@pytest.mark.parametrize("number,lab", sorted(OWN_JOB_LABS))
def test_break_it_lab_under_the_command(monkeypatch, number, lab):
    status, out = run(monkeypatch, number, lab=lab)
    assert status == 0, out[-3000:]
    assert LABS[(number, lab)] in out, out[-3000:]


def test_every_lab_is_tested():
    assert {(e.number, lab) for e in READY for lab in e.breaks} == set(LABS)


@pytest.mark.parametrize("entry", READY, ids=lambda e: e.number)
def test_text_states_what_the_module_computes(entry):
    path = lesson.text_path(entry)
    text = path.read_text()
    module = importlib.import_module(entry.module)
    missing = [claim for claim in module.claims() if claim not in text]
    assert not missing, f"{entry.text} does not state {missing} (computed by {entry.module})"
    assert "## Try this" in text
    for lab in entry.breaks:
        assert f"--break {lab}" in text, f"{entry.text} does not describe its lab {lab}"


def test_list_and_lookup(capsys):
    args = type("Args", (), {"which": "list"})()
    assert lesson.main(args) == 0
    out = capsys.readouterr().out
    for entry in READY:
        assert entry.number in out
    assert "ready" in out
    assert find("3") is find("03") is find("ring_and_tree")
    with pytest.raises(ValueError, match="no lesson"):
        find("99")


def test_bad_lab_and_unwritten_lesson_are_refused():
    with pytest.raises(ValueError, match="has no lab"):
        lesson.run_lesson("03", lab="nope")
    planned = [e for e in LESSONS if not lesson.exists(e)]
    if planned:
        with pytest.raises(ValueError, match="not written yet"):
            lesson.run_lesson(planned[0].number)


def test_tour_steps_cover_every_ready_lesson():
    steps = lesson.tour_steps()
    assert [title.split(":")[0] for title, _ in steps] == [f"Lesson {e.number}" for e in READY]
    assert all(callable(fn) for _, fn in steps)


def test_lessons_package_is_light():
    code = (
        "import sys, minipar.course.lessons, minipar.cli.lesson; "
        "print(sorted({'numpy', 'torch', 'mpi4py'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip() == "[]", f"listing lessons must not import {out.strip()}"
