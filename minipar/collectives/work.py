"""Async collectives: `async_op=True` returns a Work handle, and a progress thread does the work.

One daemon thread per process takes queued collectives in the order they were issued and runs
them to completion, so communication proceeds while the caller computes (DDP overlapping the
gradient all-reduce with the backward pass) without the caller polling. The call's tag is taken
in the caller's thread at issue time, so async and blocking collectives in flight together never
match each other's messages. This needs MPI_THREAD_MULTIPLE (checked by minipar.init).
"""

from __future__ import annotations

import queue
import threading

from minipar.comm.guards.stall import WorkWait
from minipar.errors import CommTimeoutError
from minipar.state import process


class Work:
    """Like torch.distributed's Work: `wait()` blocks (and re-raises the call's error),
    `is_completed()` polls."""

    def __init__(self, description: str = "collective"):
        self.description = description
        self._done = threading.Event()
        self._error: BaseException | None = None

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._done.is_set():
            with WorkWait(self.description):  # this thread can call nothing meanwhile (stall.py)
                finished = self._done.wait(timeout)
            if not finished:
                raise CommTimeoutError(f"{self.description} did not finish within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return True

    def exception(self) -> BaseException | None:
        return self._error

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()


class ProgressThread:
    """The thread that runs async collectives, kept as `process.progress` (minipar.state)."""

    def __init__(self):
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="minipar-progress", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            work, run = job
            try:
                run()
            except BaseException as error:  # handed to whoever waits on the Work
                work._finish(error)
            else:
                work._finish()
            finally:
                self.jobs.task_done()

    def idle(self) -> bool:
        """No async collective queued or running (a rank leaving may then finalize MPI)."""
        return self.jobs.unfinished_tasks == 0

    def close(self) -> None:
        """Let queued collectives finish, then stop the thread (minipar.finalize)."""
        self.jobs.put(None)
        self.thread.join()


def submit(run, description: str) -> Work:
    """Queue `run()` on the progress thread (started on first use); returns its Work."""
    if process.progress is None:
        process.progress = ProgressThread()
    work = Work(description)
    process.progress.jobs.put((work, run))
    return work
