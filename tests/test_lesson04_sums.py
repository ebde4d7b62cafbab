"""Lesson 04 times a sum in the state a ring step finds it: `prepare` (the neighbour reading the
destination) runs after the barrier and right before the sum, outside the timed interval; the
timing is kept once per key. One process, a page of its own (no MPI here: lesson 04's run under
mpiexec is tests/test_lessons.py's)."""

import time

from minipar.course.lessons import l04_topology_bandwidth as l04


class Comm:
    def __init__(self, events):
        self.events = events

    def barrier(self):
        self.events.append("barrier")


class Page:
    def __init__(self):
        self.events = []
        self.comm = Comm(self.events)

    def gather(self, value):
        return [value]


def test_prepare_runs_after_the_barrier_and_is_not_timed():
    page = Page()

    def prepare():
        page.events.append("prepare")
        time.sleep(0.02)  # a slow read by the neighbour: none of it may count

    def op():
        page.events.append("op")

    low, _, high = l04.spread(page, op, 3, warm=False, prepare=prepare)
    assert page.events == ["barrier", "prepare", "op"] * 3
    assert high < 0.01, f"the sum's time includes prepare's: {high:.4f} s"


def test_timed_once_uses_the_prepare_make_returns_and_keeps_the_time():
    page, built = Page(), []

    def make():
        built.append(1)
        return (lambda: page.events.append("op")), (lambda: page.events.append("prepare"))

    first = l04.timed_once(page, ("sum", 1), make, 2)
    again = l04.timed_once(page, ("sum", 1), make, 2)
    assert first == again and len(built) == 1
    assert page.events == ["op", "barrier", "prepare", "op", "barrier", "prepare", "op"]
