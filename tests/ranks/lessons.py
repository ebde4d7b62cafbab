"""The lessons and their break-it labs on warm ranks (run by tests/test_lessons.py): each case
calls a lesson module's main() with the arguments `minipar lesson NN --quick [--break LAB]`
passes it, on the lesson's own number of ranks, and fails if it returns non-zero. The test reads
what every rank printed from the case's output: rank 0's key lines, nothing from the others.

A lesson's Page finalizes minipar only when it started it, so a lesson runs on ranks that
already have minipar running as it does under the launcher. The labs that leave their group
broken on purpose (02's deadlock, 10's refused message) run under the launcher instead, as
`minipar lesson` runs them (OWN_JOB).
"""

import importlib
import os

from minipar.course.lessons import LESSONS

OWN_JOB = {("02", "send-first"), ("10", "no-counts")}  # they leave the group failed
# quick runs that go through `minipar lesson` itself (its command, its exit, its --json records)
LAUNCHER = {"01", "12"}


def run(entry, argv):
    def case():
        module = importlib.import_module(entry.module)
        # rank 0's tables, unwrapped, so lines can be matched (the harness restores the
        # environment after every case, testing/isolation.py)
        os.environ["COLUMNS"] = "120"
        # the lessons' timing claims are a benchmark (`minipar lesson NN --json`, the records
        # in lessons/records/), never a timed test: here they are shown, not judged, while
        # bytes, steps and values are judged as always
        os.environ["MINIPAR_TIMING"] = "shown"
        status = module.main(argv)
        assert status == 0, f"lesson {entry.number} {' '.join(argv)} returned {status}"

    return case


def cases(size):
    table = {}
    for entry in LESSONS:
        if entry.ranks != size:
            continue
        if entry.number not in LAUNCHER:
            table[f"quick.{entry.number}"] = run(entry, ["--quick"])
        for lab in entry.breaks:
            if (entry.number, lab) not in OWN_JOB:
                table[f"lab.{entry.number}.{lab}"] = run(entry, ["--quick", "--break", lab])
    return table
