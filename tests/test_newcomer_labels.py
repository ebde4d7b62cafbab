"""Labels a newcomer reads wrong: train's bar cut to "60/…", a lesson's "1 ranks", and pipeline
timelines whose short tasks lose their micro-batch digit (lesson 07's quick run)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ROOT

from minipar.parallel.pipeline import schedules as S
from minipar.parallel.pipeline import verify as V


def _plain(console) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", console.export_text())


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_train_bar_shows_its_total_at_any_width(width):
    """The step's info is long (loss, norm, lr, tokens/s, memory): on a narrow terminal rich
    cut every column, "60/400" to "60/…" and "train" to "tra…". Only the info may wrap."""
    from rich.console import Console

    from minipar.cli.train import progress_bar

    console = Console(width=width, record=True, force_terminal=True)
    bar = progress_bar(console)
    info = "step 59  loss 5.2553  norm 1.822  lr 1.00e-03  11,237 tok/s  364-369 MiB/rank"
    task = bar.add_task("train", total=400, info=info)
    bar.update(task, completed=60)
    console.print(bar.make_tasks_table(bar.tasks))
    text = _plain(console)
    assert "60/400" in text and "train" in text and "…" not in text, text
    assert "364-369" in text.replace("\n", " "), text


def test_a_folded_timeline_keeps_every_tasks_label():
    """Interleaved 1F1B (v = 2) has chunk passes of half a stage's time: on 60 slots a line
    they got one slot each and showed "F" or nothing for micro-batch 3's forward. print()
    folds the chart into blocks so each task spans two slots, and every rank's tasks read in
    the verifier's order (kind and micro-batch), the bubble after the last block."""
    from rich.console import Console

    from minipar.parallel.pipeline import Timeline

    report = V.verify(S.program("interleaved", 4, 8, 2))
    timeline = Timeline.simulated(report)
    console = Console(width=80, record=True, color_system=None)
    timeline.print(console, width=60)
    lines = [line for line in _plain(console).splitlines() if line.startswith("rank ")]
    assert all(len(line) <= 80 for line in lines)
    letter = {"Forward": "F", "Backward": "B", "BackwardInput": "b", "BackwardWeight": "w"}
    for rank in range(4):
        row = "".join(
            line[7:].split("  bubble")[0] for line in lines if line.startswith(f"rank {rank} ")
        )
        order = sorted(report.events[rank], key=lambda event: event[1])
        want = [f"{letter[type(ins).__name__]}{ins.mb % 10}" for ins, _, _ in order]
        assert re.findall(r"[FBbw]\d", row) == want, (rank, row)
    assert sum("bubble" in line for line in lines) == 4


@pytest.mark.own_job
@pytest.mark.timeout(60)
def test_a_lesson_on_one_rank_says_one_rank():
    code = (
        "from minipar.course.lessons.page import Page\n"
        "Page('12', 'Failures at scale', argv=['--quick']).finish()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rank, quick" in done.stdout and "1 ranks" not in done.stdout, done.stdout
