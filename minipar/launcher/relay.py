"""Whole lines per rank: each rank's stdout and stderr reach the launcher through its own pipe.

Why not let mpiexec forward the output: it forwards whatever chunks a rank's pipe holds, so two
ranks printing at once interleave inside lines (`RANKRANK 1 4`), and it may drop what a rank wrote
just before MPI_Abort. Instead the launcher makes one named pipe (FIFO) per rank and stream in a
private folder; each rank starts as `python -m minipar.launcher relay FOLDER -- program ...`, which
points its file descriptors 1 and 2 at its two FIFOs and then exec()s the program (same process, so
mpiexec's signals still reach it, and output from C code and child processes is caught too). The
launcher reads every FIFO, cuts the bytes into lines, and writes each whole line at once, with a
`[rank3]: ` prefix when tagging is on. A rank's unfinished last line is flushed when it ends.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import sys
import tempfile
import time

from minipar.launcher import stop
from minipar.launcher.errors_once import Fold

RANK_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
DRAIN_SECONDS = 2.0  # after the job ends: how long to wait for its last bytes
ABORT_WAIT = 10.0  # after a rank said it aborts: how long the MPI's launcher has to end the job
FOLDER_ENV = "MINIPAR_RELAY_FOLDER"  # where a rank says it aborts (transport/mpi.py's say_aborted)


def tag_from_env() -> bool:
    return os.environ.get("MINIPAR_TAG_OUTPUT", "") not in ("", "0")


def prefix(rank: int) -> str:
    return f"[rank{rank}]: "


class Relay:
    """The FIFOs of one job of n ranks, and the loop that forwards their lines."""

    def __init__(self, n: int, tag: bool = False, out=None, err=None, fold_errors=False):
        self.n, self.tag = n, tag
        self.fold = Fold(n) if fold_errors else None  # the same error from many ranks: once
        self.rank_of: dict[int, int] = {}  # a rank's stderr FIFO -> the rank
        self.quiet_launcher = False  # drop hydra's lines about a proxy gone (supervised jobs)
        self._out, self._err = out, err  # None: whatever sys.stdout/sys.stderr are at write time
        # the owner's pid in the name: a SIGKILLed launcher's pipes are found and removed later
        self.folder = tempfile.mkdtemp(prefix=f"minipar-io-{os.getpid()}-")
        self.readers: dict[int, tuple[str, str]] = {}  # fd -> (line prefix, "out" or "err")
        # our own write ends, per rank: a FIFO nobody opened yet is not at EOF (closed once the
        # rank has opened them: they then close when it ends, see _watch_up)
        self.keep: dict[int, list[int]] = {rank: [] for rank in range(n)}
        self.pending: dict[int, bytes] = {}
        self.closed: set[str] = set()  # streams whose reader has gone (a closed pipe)
        self.hosts: dict[str, str] = {}  # address -> node name, added to the launcher's lines
        self.launcher_fds: set[int] = set()
        self.aborted_at, self.aborted = None, ""  # when a rank said it aborts, and which
        self.gone: dict[int, float] = {}  # rank -> when its output closed, the job running on
        self.lost: list[int] = []  # the first ranks to go without exiting (see lost_first)
        self.watched: set[int] = set()  # ranks whose FIFOs we let go before minipar.init's up.R
        self._running = False
        _enough_files(4 * n + 64)  # two FIFOs per rank, each opened twice here
        for rank in range(n):
            for stream in ("out", "err"):
                path = os.path.join(self.folder, f"{rank}.{stream}")
                os.mkfifo(path, 0o600)
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                self.keep[rank].append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                self.readers[fd] = (prefix(rank) if tag else "", stream)
                self.rank_of[fd] = rank

    def wrap(self, program: list[str]) -> list[str]:
        """The command each rank runs: the relay's rank side, then the program."""
        return [sys.executable, "-m", "minipar.launcher", "relay", self.folder, "--", *program]

    def environ(self, env: dict) -> dict:
        """Ranks write to FIFOs, not a terminal: tell rich the terminal's width (less the tag)
        and that colour is fine, when there is a terminal; otherwise tables size themselves."""
        stream = self._out or sys.stdout
        if _isatty(stream):
            width = shutil.get_terminal_size().columns
            width -= len(prefix(self.n - 1)) if self.tag else 0
            env.setdefault("COLUMNS", str(max(width, 40)))
            env.setdefault("FORCE_COLOR", "1")
        return env

    # -- the launcher side: forward lines until the job ends ------------------------------------

    def pump(self, proc, timeout: float | None = None) -> int:
        """Forward the ranks' lines (and mpiexec's own output) until proc ends; its exit status,
        or 124 after killing the whole process group when timeout ran out."""
        sel = selectors.DefaultSelector()
        for fd in self.readers:
            sel.register(fd, selectors.EVENT_READ)
        for pipe, stream in ((proc.stdout, "out"), (proc.stderr, "err")):
            if pipe is not None:
                os.set_blocking(pipe.fileno(), False)
                self.readers[pipe.fileno()] = ("", stream)
                self.launcher_fds.add(pipe.fileno())
                sel.register(pipe.fileno(), selectors.EVENT_READ)
        deadline = None if timeout is None else time.monotonic() + timeout
        status = None
        self._running = True
        try:
            while proc.poll() is None:
                if deadline is not None and time.monotonic() > deadline:
                    stop.stop(proc)
                    status = 124
                    break
                # the ranks' marks (aborted.R, open.R, up.R), listed while any is still awaited
                said = set(os.listdir(self.folder)) if self.aborted_at is None or self.keep else ()
                if self._abort_overdue(said):
                    stop.stop(proc)
                    status = proc.returncode or 1
                    break
                self._read(sel, 0.1)
                self._write_due()
                self._watch_up(said)
            self._running = False
            self.lost = self.lost_first()
            stop.signal_pid(-proc.pid, signal.SIGKILL)  # no rank (or its child) outlives the job
            self._let_go(list(self.keep))
            end = time.monotonic() + DRAIN_SECONDS
            while sel.get_map() and time.monotonic() < end:
                self._read(sel, 0.1)
            for fd in list(self.pending):
                self._emit(fd, self.pending.pop(fd) + b"\n")
            if self.fold is not None:
                self._write("err", "".join(self.fold.end()))
        finally:
            sel.close()
            self.close()
        return proc.returncode if status is None else status

    def _abort_overdue(self, said) -> bool:
        """True once a rank said it aborts (`said`: the folder's names) and the MPI's launcher
        still runs ABORT_WAIT seconds later (it waits for a node it cannot reach): say so, and
        the job is stopped."""
        if self.aborted_at is None:
            aborted = sorted(n for n in said if n.startswith("aborted."))
            if aborted:
                self.aborted_at, self.aborted = time.monotonic(), aborted[0].split(".")[1]
            return False
        if time.monotonic() - self.aborted_at < ABORT_WAIT:
            return False
        sys.stderr.write(
            f"minipar run: rank {self.aborted} aborted the job {ABORT_WAIT:g} s ago and the MPI's "
            "launcher has not ended it (a node it cannot reach?): stopping it\n"
        )
        return True

    def _read(self, sel, wait: float) -> None:
        ready = sel.select(wait)
        now = time.monotonic()
        for order, (key, _) in enumerate(ready):
            fd = key.fd
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(fd)
                # streams closed in one select: in the order the kernel saw them close (epoll's
                # ready list is first come, first served), which a busy relay reads at once
                self._closed(fd, now + order * 1e-9)
                continue
            data = self.pending.pop(fd, b"") + chunk
            cut = data.rfind(b"\n") + 1
            if cut:
                self._emit(fd, data[:cut])
            if cut < len(data):
                self.pending[fd] = data[cut:]

    def _let_go(self, ranks) -> None:
        """Close our write ends of these ranks' FIFOs."""
        for rank in ranks:
            for fd in self.keep.pop(rank, []):
                os.close(fd)

    def _watch_up(self, said) -> None:
        """Ranks that have opened their FIFOs (open.R, rank_main; `said`: the folder's names)
        need ours no more: let go, so that a rank's streams close the moment it ends. Its end
        is timed right only if we let go before it could end: before minipar.init said it is
        up (up.R, transport/mpi.py)."""
        if self.keep:
            opened = [r for r in list(self.keep) if f"open.{r}" in said]
            self.watched.update(r for r in opened if f"up.{r}" not in said)
            self._let_go(opened)

    def _closed(self, fd: int, now: float) -> None:
        """A rank's stream closed while the MPI's launcher runs: the rank has ended. Noted
        unless some rank had said it aborts (the launcher is then killing the rest)."""
        rank = self.rank_of.get(fd)
        if rank is None or not self._running or rank in self.gone:
            return
        if not any(n.startswith("aborted.") for n in os.listdir(self.folder)):
            self.gone[rank] = now

    def lost_first(self) -> list[int]:
        """The first ranks to end without exiting (a signal, a crash, a node lost), before any
        rank said it aborts: what a job's failure started from, whichever rank the MPI's
        launcher names (Open MPI's may name the peer that saw the socket close and aborted).
        Only ranks minipar.init marked as up are judged (up.R, transport/mpi.py), and one
        that ran its exit hooks took the mark back: it left on its own."""
        said = set(os.listdir(self.folder))
        lost = {r: t for r, t in self.gone.items() if r in self.watched and f"up.{r}" in said}
        if not lost:
            return []
        first = min(lost.values())
        return sorted(r for r, t in lost.items() if t == first)

    def _emit(self, fd: int, data: bytes) -> None:
        """Whole lines, written in one call each (prefixed when tagging)."""
        tag, stream = self.readers[fd]
        text = data.decode("utf-8", errors="replace")
        if self.hosts and fd in self.launcher_fds:
            text = name_hosts(text, self.hosts)
        if self.quiet_launcher and fd in self.launcher_fds:
            text = "".join(ln for ln in text.splitlines(True) if not HYDRA_PROXY_GONE.search(ln))
        if self.fold is not None and stream == "err" and fd in self.rank_of:
            rank = self.rank_of[fd]
            text = "".join(out for ln in text.splitlines(True) for out in self.fold.line(rank, ln))
        if tag:
            text = "".join(tag + line for line in text.splitlines(keepends=True))
        self._write(stream, text)

    def _write_due(self) -> None:
        """The folded errors whose wait is over (errors_once.py), written without a tag."""
        if self.fold is not None:
            self._write("err", "".join(self.fold.due()))

    def _write(self, stream: str, text: str) -> None:
        if not text:
            return
        target = (self._out or sys.stdout) if stream == "out" else (self._err or sys.stderr)
        if stream in self.closed:
            return
        try:
            target.write(text)
            target.flush()
        except BrokenPipeError:  # `minipar run ... | head`: the reader left; the job runs on
            self.closed.add(stream)
            _silence(target)

    def close(self) -> None:
        for fd in list(self.readers):
            try:
                os.close(fd)
            except OSError:
                pass
        self._let_go(list(self.keep))
        for _ in range(20):  # a rank still starting may make its mark while this removes them
            shutil.rmtree(self.folder, ignore_errors=True)
            if not os.path.exists(self.folder):
                break
            time.sleep(0.01)


# hydra's lines once a node's proxy has gone (its socket closed): noise before minipar's own
# explanation of the lost node (launcher/supervisor.py)
HYDRA_PROXY_GONE = re.compile(
    r"^\[mpiexec@[^\]]*\] .*(assert \(!closed\) failed|callback returned error status|"
    r"error waiting for event|process manager error waiting for completion)"
)


def name_hosts(text: str, hosts: dict[str, str]) -> str:
    """The launcher's lines with each emulated node's address followed by its name: hydra's
    `RUNNING AT 10.200.0.2` reads `RUNNING AT 10.200.0.2 (node1)`."""
    for address, name in hosts.items():
        text = re.sub(re.escape(address) + r"(?!\d)", f"{address} ({name})", text)
    return text


def _enough_files(count: int) -> None:
    """Raise this process's open-file limit to count when the hard limit allows (a big job)."""
    try:
        import resource
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count:
        top = count if hard == resource.RLIM_INFINITY else min(count, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _silence(stream) -> None:
    """Point a stream whose reader left at /dev/null, so exiting does not complain either."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (AttributeError, OSError, ValueError):
        pass


# -- the rank side: python -m minipar.launcher relay FOLDER -- program ... ------------------------


def rank() -> str:
    for name in RANK_ENV:
        if name in os.environ:
            return os.environ[name]
    return "0"


def rank_main(argv: list[str]) -> None:
    """Point fds 1 and 2 at this rank's FIFOs, then become the program (exec)."""
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m minipar.launcher relay FOLDER -- program [args]")
    folder, program = argv[0], argv[2:]
    os.environ[FOLDER_ENV] = folder  # the program may say it aborts there (comm/transport/mpi.py)
    for fd, stream in ((1, "out"), (2, "err")):
        pipe = os.open(os.path.join(folder, f"{rank()}.{stream}"), os.O_WRONLY)
        os.dup2(pipe, fd)
        os.close(pipe)
    with open(os.path.join(folder, f"open.{rank()}"), "w"):
        pass  # the launcher may now let go of its own write ends (Relay._watch_up)
    try:
        os.execvp(program[0], program)
    except OSError as error:
        os.write(2, f"minipar run: cannot start {program[0]!r}: {error.strerror}\n".encode())
        os._exit(127)
