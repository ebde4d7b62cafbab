"""One rank fails, the others stop at once: a graded case's verdict in a fraction of a second.

A student's mistake often fails on one rank (a receive of the wrong size, an assertion) while
the others wait for a message that rank will now never send: without help they would each wait
out their timeout, seconds per case, and then report the timeout as if it were the fault. So,
while a graded case runs (stepdiff.explained):

    with stopping.Stopper(control) as stop:       # control: the grader's own group
        try:
            case()
        except Exception as error:
            stop.tell(error)                      # "I failed with ...": to every other rank
    ...
    stop.settle(told)                             # after the ranks pooled who told

A thread on each rank listens on the grader's group (STOP_TAG, a user tag no case uses). Hearing
that rank r failed, it marks this process's groups failed (`comm._failure`, what the watchdog
sets for a mismatch: every wait on them polls it and raises MismatchError at once, saying rank r
failed first). Afterwards `settle` receives every notice still unread and puts the marks back,
so the next case finds its groups as the harness left them (the harness realigns the calls of a
failed case, minipar.testing.isolation). `consequence(error)` says whether an error was this
stop (or a timeout): the grader names the first rank whose error was neither as the root cause.

Only on MPI groups of two ranks or more; elsewhere a Stopper does nothing.
"""

from __future__ import annotations

import threading

from minipar.errors import CommTimeoutError, MismatchError
from minipar.state import process

STOP_TAG = 30011  # on the grader's own group only
POLL = 0.02  # seconds between the listener's looks
STOPPED = "stopped waiting: rank {rank} had already failed ({what})"


def first_line(error: BaseException) -> str:
    """'MessageSizeError: rank 1 ... arrived; sizes must match', whole (never cut)."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    if getattr(type(error), "says_where", False):  # stepdiff's own: its words say it all
        return first
    return f"{type(error).__name__}: {first}".rstrip(": ")


def consequence(error: BaseException | None) -> bool:
    """True for an error that follows another rank's: this module's stop, or a timeout."""
    if isinstance(error, MismatchError):
        return str(error).startswith("stopped waiting: rank ")
    return isinstance(error, CommTimeoutError)


def followed(line: str) -> bool:
    """The same as `consequence`, for an error's first line (first_line)."""
    return line.startswith(("MismatchError: stopped waiting: rank ", "CommTimeoutError"))


class Stopper:
    def __init__(self, control):
        self.control = control
        self.live = hasattr(control, "mpi") and getattr(control, "size", 1) > 1
        self.heard: dict[int, str] = {}
        self.marked: list = []  # (group, its _told before the mark)
        self.sent: list = []
        self.told = False
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread = None

    def __enter__(self):
        if self.live:
            self._thread = threading.Thread(target=self._listen, name="grader-stop", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        return False

    def tell(self, error: BaseException) -> None:
        """Tell every other rank that this one failed (unless its error was a consequence)."""
        if not self.live or self.told or consequence(error):
            return
        self.told = True
        what = first_line(error)
        for q in range(self.control.size):
            if q != self.control.rank:
                self.sent.append(self.control.mpi.isend(what, dest=q, tag=STOP_TAG))

    def _listen(self) -> None:
        from mpi4py import MPI

        status = MPI.Status()
        while not self._done.wait(POLL):
            with self._lock:
                if self.control.mpi.Iprobe(MPI.ANY_SOURCE, STOP_TAG, status):
                    self._take(status.Get_source())

    def _take(self, source: int) -> None:
        what = self.control.mpi.recv(source=source, tag=STOP_TAG)
        self.heard[source] = what
        if len(self.heard) == 1:
            self._mark(STOPPED.format(rank=self.control.global_ranks[source], what=what))

    def _mark(self, text: str) -> None:
        """Fail this process's groups (the grader's own excepted): their waits raise now."""
        groups = [ref() for ref in list(process.groups.values())] + [process.world]
        for group in {id(g): g for g in groups if g is not None}.values():
            if group is self.control or getattr(group, "name", "") == "harness":
                continue
            if getattr(group, "_failure", "") is None:
                self.marked.append((group, group._told))
                group._failure = text

    def settle(self, told: list[int]) -> None:
        """Receive the notices of the ranks in `told` not heard yet, finish the sends, and take
        the marks back (after the ranks exchanged who told: every notice has been sent)."""
        if not self.live:
            return
        from mpi4py import MPI

        with self._lock:
            for q in told:
                if q != self.control.rank and q not in self.heard:
                    self.heard[q] = self.control.mpi.recv(source=q, tag=STOP_TAG)
        MPI.Request.Waitall(self.sent)
        for group, was_told in self.marked:
            group._failure, group._told = None, was_told
        self.marked = []
