"""Warm rank starts: one process that has imported torch forks every rank of the pool's jobs
(and of the own-job tests' launches: minipar's launcher with MINIPAR_FORK_SERVER=FOLDER/sock).

    python -m minipar.testing.zygote serve FOLDER              # the fork server (Pool starts it)
    python -m minipar.testing.zygote FOLDER/sock -m MODULE ...  # what mpiexec starts, per rank

Importing torch costs 1.5-2.5 s of a core per process: on 2 cores an 8-rank job spends about
8 s starting before its first case, and the pool starts some thirty jobs a session. So the pool
starts one fork server, which imports torch and numpy once and then waits. The jobs are still
launched by mpiexec, which still starts one process per rank: a small stand-in, "the client"
(no torch; about 0.05 s). The client connects to the server (a Unix socket), sends its argv,
environment, working directory, sys.path and every open file descriptor (stdin, stdout,
stderr and the launcher's own: MPICH's PMI_FD) as SCM_RIGHTS, and the server forks. The copy
takes all of it over and runs the module as __main__: it is the rank, with torch loaded; it
initialises MPI itself, through the launcher's descriptors, as any rank does.

    mpiexec -> client  --(argv, env, fds)-->  server --fork--> rank (runs `-m MODULE`)
    client <--{"pid"}, then {"status"}--  server <--waitpid-- rank

The client then only waits: it passes the signals it gets on to its rank (mpiexec's SIGTERM,
SIGINT) and ends the way its rank ended (exit status, or the same signal), so mpiexec sees what
it would have seen. Nothing is left behind: a client that dies (SIGKILL) has its rank killed by
the server; a server that dies has every rank killed by the kernel (PR_SET_PDEATHSIG); the
server ends when the Pool closes its stdin or exits. A client that finds no server starts the
module itself, cold. MINIPAR_TEST_ZYGOTE=0 turns the server off (each rank imports torch).

What the copy must not inherit is put back: the server's other descriptors are closed, its
signal handlers reset; the environment is the client's (torch reads none of it at import that a
test sets; minipar is not imported here, so every MINIPAR_* variable is read fresh by the rank).
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from minipar import exercises
from minipar.launcher import own_folder, shm_leftovers, stop

ZYGOTE_ENV = "MINIPAR_TEST_ZYGOTE"  # "0": no fork server, every rank starts cold
MAX_FDS = 64  # descriptors a client may hand over (a rank under hydra has about 15)
HEADER = struct.Struct("!I")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)  # fmt: skip


def enabled() -> bool:
    return os.environ.get(ZYGOTE_ENV, "1").strip().lower() not in ("0", "off", "false")


def _apart() -> list[str]:
    """While grading (MINIPAR_GRADE_COVER), the server and so every rank it forks runs apart:
    the results and the hidden tests covered, root's capabilities dropped (minipar.exercises.
    apart). Not the worked answers: a rank reads its case's before the student's file, and the
    audit hook hides them from then on."""
    hidden = [p for p in os.environ.get(exercises.COVER_ENV, "").split(os.pathsep) if p]
    prefix = exercises.apart(hidden) if hidden else []
    return prefix if prefix and exercises.runs(prefix) else []


# -- the pytest side -----------------------------------------------------------------------------
class Server:
    """The fork server process of one Pool: started at once, ready some seconds later (torch),
    ended by close() or when this process exits (its stdin closes)."""

    def __init__(self, env: dict):
        env = dict(env)
        env.setdefault("OMP_NUM_THREADS", "1")  # as the launcher gives each rank
        self.folder = own_folder.make("zygote")  # named after us: a killed session's is swept
        # torch._dynamo makes its compile cache's folder when imported: in ours, not in TMPDIR
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(self.folder, "torchinductor"))
        self.address = os.path.join(self.folder, "sock")
        self.log = open(os.path.join(self.folder, "server.log"), "w+")
        self.proc = subprocess.Popen(
            [*_apart(), sys.executable, "-m", "minipar.testing.zygote", "serve", self.folder],
            env=env,
            stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.error: str | None = None

    def ready(self, limit: float) -> bool:
        """Wait (up to `limit` s) until the server listens; False (and `error` says why) if it
        ended or took longer: the jobs then start cold."""
        deadline = time.monotonic() + limit
        while self.error is None and not os.path.exists(self.address):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.flush()
                with open(self.log.name) as f:
                    self.error = f"the fork server did not start:\n{f.read()[-2000:]}"
                self.close()
            time.sleep(0.02)
        return self.error is None

    def wrap(self, argv: list[str]) -> list[str]:
        """Python arguments that have this server fork the rank that `argv` would start."""
        return ["-m", "minipar.testing.zygote", self.address, *argv]

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # the server kills what ranks it still has and ends
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Borrowed:
    """Another process's Server, named by MINIPAR_FORK_SERVER (a pytest started by a test: the
    grader's, a harness self-test's): its ranks are forked there, this process starts no server
    of its own (a torch import saved) and does not end it."""

    proc = None  # not this process's to end

    def __init__(self, address: str):
        self.address = address

    def ready(self, limit: float) -> bool:
        return os.path.exists(self.address)

    wrap = Server.wrap

    def close(self) -> None:
        pass


# -- the server ------------------------------------------------------------------------------
def serve(folder: str) -> None:
    """Import what every rank needs, listen on FOLDER/sock (it appears once the server is
    ready), fork on request; end when stdin closes (the Pool is gone)."""
    _preload()
    _freeze()
    _exit_shortcut()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, "sock.new"))
    listener.listen(64)
    os.rename(os.path.join(folder, "sock.new"), os.path.join(folder, "sock"))  # ready: at once
    wake_r, wake_w = os.pipe()  # SIGCHLD wakes the select loop (set_wakeup_fd)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "parent")  # closed: the Pool is gone
    ranks: dict[int, socket.socket] = {}  # rank pid -> its client's connection
    while True:
        for key, _ in selector.select():
            if key.data == "accept":
                keep = [selector, listener, wake_r, wake_w, *ranks.values()]
                _fork_one(listener, selector, ranks, keep)
            elif key.data == "child":
                os.read(wake_r, 4096)
                _reap(ranks, selector)
            elif key.data == "parent":
                if not os.read(sys.stdin.fileno(), 4096):
                    _kill_all(ranks)
                    return
            elif ranks.get(key.data) is key.fileobj:  # a client's connection: readable
                pid = key.data  # only when it closed (the client died)
                selector.unregister(key.fileobj)
                key.fileobj.close()
                del ranks[pid]
                _signal(pid, signal.SIGKILL)
            # (else: a connection _reap closed earlier in this round, its rank already ended)


# What the ranks import, heaviest first: torch (~2 s of a core) and torch._dynamo, which
# torch imports on the first optimizer built (~1.7 s more); what the strategies' references to
# torch's own (pipelining) and the suites (pytest, hypothesis) add. Never minipar: it reads
# MINIPAR_* variables at import, and each rank must read its own.
PRELOAD = ("numpy", "torch", "torch._dynamo", "torch.distributed.pipelining", "pytest",
           "hypothesis")  # fmt: skip


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # (torch is optional for a numpy-only job; so are the others)
            pass


def _freeze() -> None:
    """Move every object the preloads made to the collector's permanent generation (Python's
    advice before forking): a rank's full collections (Python's own, the pool's after every
    batch) then walk only what the rank made, not torch's ~400,000 objects, and do not write
    to the pages it shares with this server. Measured: the pool's collection after a batch
    0.22 -> 0.01 s of a core per rank, an 8-rank job's start 6.0 -> 3.5 core-seconds."""
    gc.collect()
    gc.freeze()


_EXIT_CODE: list = [None]  # set by a rank as it leaves: the shortcut below ends it there
_SHORTCUT: list = []  # the C callback, kept alive


def _exit_shortcut() -> None:
    """A C atexit handler registered after the preloads, so that a rank's exit(3) runs every
    handler the rank registered itself (MPICH's, which tell the launcher the rank is done) and
    then ends, before the destructors of what the server preloaded (torch's C++ statics:
    ~0.25 s of a core per rank, most of it copying the server's pages they write to)."""
    try:
        import ctypes

        @ctypes.CFUNCTYPE(None)
        def shortcut():
            if _EXIT_CODE[0] is not None:
                os._exit(_EXIT_CODE[0])

        ctypes.CDLL(None).atexit(shortcut)
        _SHORTCUT.append(shortcut)
    except (OSError, AttributeError):
        pass


def _fork_one(listener, selector, ranks, keep) -> None:
    conn, _ = listener.accept()
    try:
        conn.settimeout(10)  # a client sends its request as soon as it has connected
        request, fds = _receive_request(conn)
        conn.settimeout(None)
    except (OSError, ValueError):
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the rank
        _become(request, fds, conn, keep)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:  # the client is gone already
        _signal(pid, signal.SIGKILL)
    ranks[pid] = conn
    selector.register(conn, selectors.EVENT_READ, pid)


def _reap(ranks, selector) -> None:
    """Tell each ended rank's client how it ended (its wait status), then forget it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = ranks.pop(pid, None)
        if conn is not None:
            selector.unregister(conn)
            try:
                conn.sendall(json.dumps({"status": status}).encode() + b"\n")
            except OSError:
                pass
            conn.close()


def _kill_all(ranks) -> None:
    """Kill every rank (the Pool is gone), reap them, and unlink the segments they mapped: a
    rank spinning in a student's loop never reaches its own clean-up."""
    segments = shm_leftovers.mapped(list(ranks))
    for pid in ranks:
        _signal(pid, signal.SIGKILL)
    for pid in ranks:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped already
            pass
    shm_leftovers.remove(segments)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


# -- the rank: the server's copy taking over the client's process ------------------------------
def _become(request: dict, fds: list[int], conn, keep) -> None:
    """In the forked copy: the client's descriptors at their numbers, everything else of the
    server's closed, its environment, directory, argv and path; then run the module."""
    code = 1
    try:
        stop.die_with_parent()  # the server dies: so does this rank
        os.setsid()  # a session of its own, as hydra gives each rank: no signal of the server's
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, *FORWARDED):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        watch = _dup_high(conn.fileno())
        conn.close()
        for sock in keep:
            _close(sock)
        _take_descriptors(request["fds"], fds, keep={watch})
        _die_with_client(watch)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        _threads()
        _fresh_temp()
        sys.path[:] = _path(request["path"], request["argv"])
        sys.argv = list(request["argv"])
        code = _run(request["argv"])
    except SystemExit as end:
        code = _exit_code(end.code)
    except BaseException:  # noqa: BLE001  (as an interpreter would: the hook prints it)
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        _leave(code)


def _threads() -> None:
    """torch fixed its thread count from OMP_NUM_THREADS when the server imported it: the
    rank's own value applies instead (before any parallel work, as at a cold start)."""
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _fresh_temp() -> None:
    """tempfile remembers the folder it found first (in the server): the rank's TMPDIR counts."""
    tempfile.tempdir = None


def _path(path: list[str], argv: list[str]) -> list[str]:
    """sys.path as the interpreter would make it for argv: the client's (its first entry the
    working directory, as for -m), or for a script its folder first."""
    if argv[0] == "-m" or not path:
        return list(path)
    return [os.path.dirname(os.path.abspath(argv[0])), *path[1:]]


def _die_with_client(fd: int) -> None:
    """End this process the moment its client ends, as it would have ended itself: a launcher
    ends a job by killing the processes it started (hydra: SIGKILL to each one's process group,
    after an MPI_Abort), and those are the clients. The kernel signals SIGIO, whose default
    action ends the process, when the client's end of the connection `fd` closes; no thread,
    no GIL, no waiting for the server to notice (it kills the rank too, a moment later)."""
    import fcntl
    import select

    signal.signal(signal.SIGIO, signal.SIG_DFL)
    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    if poll.poll(0):  # gone before the signal was armed
        os._exit(1)


def _take_descriptors(numbers: list[int], fds: list[int], keep=frozenset()) -> None:
    """Put received descriptor fds[i] at number numbers[i] (inheritable, as it was), closing
    every other descriptor above stderr but `keep`."""
    high = [_dup_high(fd) for fd in fds]  # out of the way of the numbers they go to
    for fd in fds:
        os.close(fd)
    for number, fd in zip(numbers, high):
        os.dup2(fd, number, inheritable=True)
    wanted = set(numbers) | set(high) | set(keep)
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        if fd > 2 and fd not in wanted:
            _close(fd)
    for fd in high:
        if fd not in numbers:
            os.close(fd)
    for fd in {0, 1, 2} - set(numbers):  # the client had none there: nor has the rank
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)


def _dup_high(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, 1024)


def _close(item) -> None:
    """Close a socket, selector or descriptor number of the server's."""
    try:
        if isinstance(item, int):
            os.close(item)
        else:
            item.close()
    except OSError:
        pass


def _run(argv: list[str]) -> int:
    import runpy

    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(argv[0], run_name="__main__")
    return 0


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _leave(code: int) -> None:
    """End as the interpreter would: atexit handlers, streams flushed, MPI finalized; then exit
    without the server's interpreter teardown."""
    import atexit

    try:
        atexit._run_exitfuncs()
        _finalize_mpi()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        _exit_c(code)


def _exit_c(code: int) -> None:
    """exit(3), not _exit(2): the C library's exit handlers and the shared libraries'
    destructors run, as when an interpreter ends. MPICH tells its launcher the rank is done
    there (PMI's finalize, after MPI_Finalize); a rank that skips it is, to hydra, a rank that
    died, and hydra kills every rank still running."""
    _EXIT_CODE[0] = code
    try:
        import ctypes

        ctypes.CDLL(None).exit(code)
    finally:
        os._exit(code)


def _finalize_mpi() -> None:
    """What mpi4py does as the interpreter ends (Py_AtExit, which os._exit skips): MPI_Finalize
    if MPI is up. Without it the rank leaves without telling the launcher (PMI's finalize), and
    hydra, seeing its connection close, kills every rank still running: a job that ended well
    fails with signal 9, the more often the later the other ranks exit."""
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            _free_requests(mpi)
            mpi.Finalize()
    except Exception:  # noqa: BLE001  (mpi4py ignores its failure there too)
        pass


def _free_requests(mpi) -> None:
    """What the interpreter's teardown does before mpi4py finalizes: every request object
    still alive (a program may keep the ones it gave up on, with their buffers: minipar's
    process.abandoned) is deallocated, and mpi4py frees its MPI request. Left alive, they hold
    COMM_WORLD, and MPICH's MPI_Finalize fails ("pending references"), skipping PMI's finalize.
    (It still fails now and then after a job's failed cases: tests/test_harness.py's clean end
    starts its ranks cold.)"""
    for obj in gc.get_objects():
        if isinstance(obj, mpi.Request) and obj:  # (not MPI_REQUEST_NULL)
            try:
                obj.Free()
            except Exception:  # noqa: BLE001
                pass


# -- the wire: one request with descriptors, then JSON lines back ------------------------------
def _send_request(sock, request: dict, fds: list[int]) -> None:
    body = json.dumps(request).encode()
    socket.send_fds(sock, [HEADER.pack(len(body))], fds)
    sock.sendall(body)


def _receive_request(sock) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(sock, HEADER.size, MAX_FDS)
    if len(data) != HEADER.size:
        for fd in fds:
            os.close(fd)
        raise ValueError("short request")
    (length,) = HEADER.unpack(data)
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise ValueError("request cut short")
        body += chunk
    return json.loads(body), list(fds)


# -- the client: what mpiexec starts --------------------------------------------------------------
def client(address: str, argv: list[str]) -> None:
    """Have the server fork this rank; wait for it and end as it ended. No server, or
    interpreter options the fork cannot honour (-c, -u, -X ...): run cold."""
    if not argv or (argv[0].startswith("-") and argv[0] != "-m"):
        _cold(argv)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
        numbers = _open_descriptors(exclude=sock.fileno())
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "path": sys.path,
                   "umask": _umask(), "fds": numbers}  # fmt: skip
        _send_request(sock, request, numbers)
        reader = sock.makefile("rb")
        pid = json.loads(reader.readline())["pid"]
    except (OSError, ValueError) as error:  # (an empty answer: the server did not fork)
        print(f"minipar.testing.zygote: no fork server at {address} ({error}); starting cold",
              file=sys.stderr, flush=True)  # fmt: skip
        sock.close()
        _cold(argv)
    for signum in FORWARDED:  # mpiexec's signals are for the rank
        signal.signal(signum, lambda signum, _frame: _signal(pid, signum))
    # the descriptors stay open here too, so that the launcher sees them close (output, PMI)
    # when this process ends, as it would for the rank itself: hydra kills a rank whose
    # output has closed and that has not exited a moment later
    line = reader.readline()
    if not line:  # the server died: the kernel killed the rank (PR_SET_PDEATHSIG)
        os._exit(1)
    _end_as(json.loads(line)["status"])


def _cold(argv: list[str]) -> None:
    """Become the interpreter running argv, as if the stand-in had never been."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *argv])


def _end_as(status: int) -> None:
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _open_descriptors(exclude: int) -> list[int]:
    numbers = []
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        try:
            os.fstat(fd)  # the listing's own descriptor is gone by now
        except OSError:
            continue
        if fd != exclude:
            numbers.append(fd)
    return sorted(numbers)[:MAX_FDS]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        serve(argv[1])
    else:
        client(argv[0], argv[1:])


if __name__ == "__main__":
    main()
