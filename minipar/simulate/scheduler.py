"""Thousands of ranks in one process: one thread per rank, one baton, a virtual clock each.

Every rank of a simulated world is a `Task`: an OS thread that runs the rank's function (the
same code a real rank runs) and holds a virtual clock in seconds. Only the task holding the
baton runs; the others sleep on their own lock. A task keeps the baton until it waits for a
message that no rank has sent yet, then hands it to the next task that can go on (first come,
first served), so a run is deterministic: no races, the same order every time.

    task 0: send to 1, wait for 3 ... (not sent yet) -> baton to task 1
    task 1: send to 2, recv from 0 (there), send to 2, wait for 0 ... -> baton to task 2
    ...

Why threads and not generators: the collectives are plain functions that call `wait()` deep
inside; only a thread (or a greenlet, not a dependency here) can stop there and resume later.
Why "run until blocked" and not "smallest clock first": a ring step blocks every rank anyway,
and letting a task run ahead cuts the handoffs (about 25 us each) from one per message to one per
wait on a message not sent yet. The clocks stay exact: a message's arrival depends only on when
it was sent and on the links (network.py), never on the order the tasks ran in.

When no task can go on but some still wait, the program deadlocked (a rank waits for a message
never sent): every waiting task is woken with a CommTimeoutError that names what it waits for.
"""

from __future__ import annotations

import _thread
import threading
from collections import deque

from minipar.errors import CommTimeoutError
from minipar.state import process

STACK_BYTES = 1 << 20  # a rank's thread: Python frames live on the heap, 1 MiB is plenty


class Task:
    """One simulated rank: its thread, its clock (seconds), its world, its result or error."""

    def __init__(self, scheduler, rank: int, fn):
        self.scheduler, self.rank, self.fn = scheduler, rank, fn
        self.clock = 0.0
        self.floor = float("inf")  # inside runner.concurrently: the clock it may go back to
        self.world = None  # this rank's default group (process.world while it runs)
        self.lock = threading.Lock()
        self.lock.acquire()  # held: the task sleeps until the baton comes
        self.waiting = None  # the request it sleeps on
        self.done = False
        self.result = self.error = None
        self.dead = ""  # set when the world deadlocked: why the wait failed

    def _main(self) -> None:
        self.lock.acquire()  # the first baton
        self.scheduler.enter(self)
        try:
            self.result = self.fn(self.rank)
        except BaseException as error:  # noqa: BLE001 - kept, re-raised by the runner
            self.error = error
        self.done = True
        _forget_this_thread()
        self.scheduler.leave(self)

    def block(self, request) -> None:
        """Sleep until `request` is complete (the transport wakes this task), or raise
        CommTimeoutError if the world deadlocks first."""
        while not request.done_real():
            self.waiting = request
            self.scheduler.switch(self)
            self.waiting = None
            if self.dead:
                raise CommTimeoutError(self.dead + f"; this rank waited for {request.describe()}")


def _forget_this_thread() -> None:
    """Drop the _DummyThread that threading made for this raw thread when the rank's code asked
    for threading.current_thread() (minipar's waits do). Before Python 3.13 it stays in
    threading's table after the thread ended: threading.enumerate() lists it for the rest of
    the process, and the watchdog reads that list (stall.all_stuck: a thread neither waiting
    nor minipar's own means the rank is not stuck, so a mismatch is never proven). One
    simulated world of a lesson left hundreds in a process that went on to run real ranks."""
    ident = threading.get_ident()
    with threading._active_limbo_lock:  # threading's own lock of that table
        if isinstance(threading._active.get(ident), threading._DummyThread):
            del threading._active[ident]


class Scheduler:
    """Runs `fn(rank)` for every rank of a simulated world, one task at a time."""

    def __init__(self):
        self.tasks: list[Task] = []
        self.ready: deque = deque()
        self.finished = threading.Lock()
        self.running = None
        self.switches = 0

    def run(self, fn, size: int, worlds) -> list[Task]:
        """Start a task per rank (worlds[r]: rank r's default group), run them to the end."""
        self.tasks = [Task(self, r, fn) for r in range(size)]
        for task, world in zip(self.tasks, worlds):
            task.world = world
        self.finished.acquire()
        saved = threading.stack_size(STACK_BYTES)
        try:  # the raw threads: threading.Thread.start waits for each to run once (0.4 ms)
            for task in self.tasks:
                _thread.start_new_thread(task._main, ())
        finally:
            threading.stack_size(saved)
        self.ready.extend(self.tasks[1:])
        self._give(self.tasks[0])
        self.finished.acquire()  # the last task to end releases it
        self.finished.release()
        return self.tasks

    def enter(self, task: Task) -> None:
        self.running = task
        process.world = task.world

    def wake(self, task: Task) -> None:
        """`task`'s request is complete: it may run again."""
        self.ready.append(task)

    def switch(self, task: Task) -> None:
        """The running task waits: give the baton to the next ready task, sleep until woken."""
        self._next()
        task.lock.acquire()
        self.enter(task)

    def pause(self, task: Task) -> None:
        """The running task could go on but lets the others run first (it is ready again)."""
        self.ready.append(task)
        self.switch(task)

    def leave(self, task: Task) -> None:
        self._next()

    def _next(self) -> None:
        if not self.ready:
            waiting = [t for t in self.tasks if not t.done]
            if not waiting:
                self.finished.release()
                return
            self._deadlock(waiting)
        self._give(self.ready.popleft())

    def _give(self, task: Task) -> None:
        self.switches += 1
        task.lock.release()

    def _deadlock(self, waiting) -> None:
        """No task can go on: wake every waiting one with the reason (it raises)."""
        failed = [t.rank for t in self.tasks if t.error is not None]
        why = (
            f"simulated world deadlocked: {len(waiting)} rank(s) wait for messages no rank will "
            "send"
            + (f" (rank {failed[0]} raised {self.tasks[failed[0]].error!r})" if failed else "")
        )
        for t in waiting:
            t.dead = why
            self.ready.append(t)
