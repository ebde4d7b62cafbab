"""The numbers lessons/*.md states about this machine agree with the recorded runs in
lessons/records/ (minipar/course/lesson_numbers.py; scripts/lesson_numbers.py rewrites them).
Reads committed files only: no lesson runs here."""

import json

import pytest

from minipar.cli import lesson
from minipar.course import lesson_numbers as numbers
from minipar.course.lessons import LESSONS

ROOT = lesson.text_path(LESSONS[0]).parents[1]
RECORDS = ROOT / "lessons" / "records"


@pytest.mark.parametrize("entry", LESSONS, ids=lambda e: e.number)
def test_every_marked_number_agrees_with_its_record(entry):
    text = (ROOT / entry.text).read_text()
    bad = numbers.disagreements(text, RECORDS)
    assert not bad, f"{entry.text} disagrees with lessons/records/: {bad}"


def test_the_texts_quote_recorded_runs():
    quoted = {record for entry in LESSONS
              for _, record, *_ in numbers.marks((ROOT / entry.text).read_text())}  # fmt: skip
    assert {"01-nodes", "04-nodes", "07", "08-full", "09-nodes", "12"} <= quoted
    for record in quoted:
        data = json.loads((RECORDS / f"{record}.json").read_text())
        assert data["claims"] and "load" in data and "host" in data


def record(tmp_path, measured, predicted=1.40, kind="relative", value=0.25):
    data = {"lesson": "04", "load": {"before": 0.3, "during": 0.5}, "observations": [],
            "claims": [{"claim": "ring / hierarchical", "predicted": predicted,
                        "measured": measured, "unit": "x", "verdict": "within",
                        "tolerance_kind": kind, "tolerance_value": value}]}  # fmt: skip
    (tmp_path / "04-nodes.json").write_text(json.dumps(data))


def test_a_number_beyond_the_tolerance_of_its_record_is_found(tmp_path):
    text = "the ring took 1.41x<!-- 04-nodes: ring / hierarchical --> the two-level time"
    record(tmp_path, 1.43)
    assert numbers.disagreements(text, tmp_path) == []  # 1.41 against 1.43: within +-25%
    record(tmp_path, 3.0)  # the case: text and run far apart
    assert len(numbers.disagreements(text, tmp_path)) == 1
    fixed = numbers.rewrite(text, tmp_path)
    assert "3x<!-- 04-nodes" in fixed and numbers.disagreements(fixed, tmp_path) == []


def test_a_prediction_and_the_load_can_be_quoted(tmp_path):
    record(tmp_path, 1.43, predicted=1.42)
    text = ("1.42x<!-- 04-nodes: ring / hierarchical; predicted --> at load "
            "0.50<!-- 04-nodes: @load -->")  # fmt: skip
    assert numbers.disagreements(text, tmp_path) == []
    assert numbers.disagreements(text.replace("0.50", "2.50"), tmp_path)


def test_the_cpu_share_a_run_lost_can_be_quoted(tmp_path):
    record(tmp_path, 1.43)
    data = json.loads((tmp_path / "04-nodes.json").read_text())
    data["cpu"] = {"lost": 0.04}
    (tmp_path / "04-nodes.json").write_text(json.dumps(data))
    assert numbers.disagreements("lost 4%<!-- 04-nodes: @lost -->", tmp_path) == []
    assert numbers.disagreements("lost 40%<!-- 04-nodes: @lost -->", tmp_path)
    assert "4%<!--" in numbers.rewrite("lost 9%<!-- 04-nodes: @lost -->", tmp_path)


@pytest.mark.parametrize(
    "written,value",
    [("1.41x", 1.41), ("83.0%", 0.83), ("231\u00a0MB/s", 231e6), ("8.83 ms", 8.83e-3),
     ("~1,234", 1234.0), ("16\u00a0MiB", 16 << 20)],
)  # fmt: skip
def test_numbers_are_read_with_their_units(written, value):
    assert numbers.parse(written) == pytest.approx(value)
