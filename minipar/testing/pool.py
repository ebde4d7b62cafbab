"""The pytest side of the warm pool: one job of ranks per (world size, transport, launch
environment), started the first time a suite needs it and kept for the pytest session.

    pool = Pool()
    results, notes, returncode, log = pool.run(suite, size, "mpi", names, timeout, case_limit,
                                               {"timeout": "10"})   # {name: {rank: result}}
    pool.close()                                                    # at the session's end

A job is `python -m minipar.testing.server` under mpiexec (or spawning gloo ranks), its ranks
warm: torch and minipar imported, minipar started. Each rank connects back to this process
(127.0.0.1, one socket each, testing/wire.py). A suite's cases go to every rank as one batch;
each rank answers case by case. The guarantees:

- a case that hangs fails within its limit (CASE_LIMIT seconds, or the suite's own, or what is
  left of run_suite's `timeout`): the failure names the ranks still inside it, with what they
  printed and where they were (faulthandler's stacks, asked for with SIGUSR1); the job is
  killed and the batch's remaining cases go to a fresh one;
- a case that kills a rank (os._exit, a segfault, MPI_Abort) fails that case only: the ranks
  that never answered are named with their output and the end of the job's log; later cases run
  on a fresh job;
- state does not leak from one case to the next (testing/isolation.py, testing/groups.py);
- the variables minipar reads when a rank starts (LAUNCH_ENV) are part of a job's key: a test
  that sets one gets a job of its own. Every other difference between this process's
  environment and the job's is sent with each batch and undone after it (MINIPAR_TIMEOUT,
  MINIPAR_DEBUG, MINIPAR_FAST_PATHS and MINIPAR_MISMATCH_AFTER are applied with
  `minipar.init(timeout=, debug=, fast_paths=, mismatch_after=)`).

At most WARM_RANKS ranks stay warm (MINIPAR_TEST_POOL_RANKS, read when a job starts; each rank
holds ~100 MB of its own beside what it shares with the fork server): starting a job past that
closes the largest ones first (the least recently used of equals), since the small world sizes
serve most suites. `minipar grade`, whose cases go by world size in order, keeps one job.
"""

from __future__ import annotations

import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time

from minipar import launcher
from minipar.launcher import own_folder, shm_leftovers, stop
from minipar.launcher.mpiexec import FORK_SERVER_ENV
from minipar.testing import case, wire, zygote

CASE_TIMEOUT = "10"  # seconds any single wait may take inside a test job (MINIPAR_TIMEOUT)
CASE_LIMIT = 300.0  # seconds a case may run before it counts as hung (minipar's waits time
# out long before: this catches a rank stuck outside them; generous for a loaded machine)
START_LIMIT = 300.0  # seconds a job may take to start (ranks importing torch, oversubscribed)
WARM_RANKS = 48  # 1 + ... + 8 and torch jobs
WARM_ENV = "MINIPAR_TEST_POOL_RANKS"
DUMP_WAIT = 1.0  # seconds a hung rank has to print its stacks after SIGUSR1

# MINIPAR_* variables minipar reads when a rank starts (at import, at init, when the default
# group is made), or that change how the job is launched: a job is kept per value of these.
LAUNCH_ENV = (
    "MINIPAR_OVERSUBSCRIBED",
    "MINIPAR_STAGE_CHUNK",
    "MINIPAR_STAGE_HOST",
    "MINIPAR_SHM_BYTES",
    "MINIPAR_SHM_BLOCK",
    "MINIPAR_SHM_LAG",
    "MINIPAR_SHM_LINK",
    "MINIPAR_LINK",
    "MINIPAR_CUDA_AWARE",
    "MINIPAR_MPIEXEC",
    "MINIPAR_TAG_OUTPUT",
    "MINIPAR_SMOKE",
    "MINIPAR_TRAIN_RANK",
    "MINIPAR_TRACE_DIR",
    "MINIPAR_EMULATED_NODES",  # the job's emulated nodes (launcher/cluster/): fixed at launch
    "MINIPAR_EMULATED_HOSTS",
    "MINIPAR_RELAY_FOLDER",  # where a rank says it aborts: its launcher's relay
    "MINIPAR_INTER_LINK",  # read once a process (cost/links.py caches the link)
    "MINIPAR_LINK_BITS",  # the emulated link's rate, told to a lesson's or calibration's ranks
    "MINIPAR_LOAD_BEFORE",  # the load average the command saw before its ranks started
    "MINIPAR_CALIBRATION",  # which calibration file this machine's numbers come from
    "MINIPAR_ROOTLESS",  # emulated nodes made in a user namespace (launcher/cluster/rootless)
    "MINIPAR_REFIT",  # a supervised training refits dp to the ranks it finds
    "MINIPAR_PROGRESS",  # a supervised training's progress file
    "MINIPAR_EXERCISES_ONLY",  # the exercises `minipar grade` chose: their cases alone run
    "MINIPAR_RING_PIECE",  # the pieced ring's piece (collectives/fast/pieces.py), read once
    "MINIPAR_TIMING",  # lessons: timing claims judged or only shown (course/claims.py)
    "MINIPAR_TRAIN_COMMAND",  # the command a stopped `minipar train` resumes with
    "MINIPAR_TRAIN_STOP",  # the file a `minipar train` launcher asks its ranks to stop with
    "MINIPAR_GRADE_NODES",  # `minipar grade --nodes N`: the grader's ranks on emulated nodes
    zygote.ZYGOTE_ENV,
    "OMP_NUM_THREADS",  # torch's threads, fixed when a rank starts
)
# read on every call, or set again for every batch (testing/isolation.py): safe per batch
PER_BATCH_ENV = (
    "MINIPAR_TIMEOUT",
    "MINIPAR_DEBUG",
    "MINIPAR_TRANSPORT",
    "MINIPAR_FAST_PATHS",
    "MINIPAR_MISMATCH_AFTER",
    "MINIPAR_MESH_ACROSS_NODES",  # read by every DeviceMesh made
    "MINIPAR_FORK_SERVER",  # read by the launcher in this process only, never by a rank
    "MINIPAR_GRADE_HIDE",  # grading: what a rank may not open once it loads a student's file
    "MINIPAR_GRADE_HIDE_ALSO",  # ... more of it, from a class's grading (the grader's only)
    "MINIPAR_GRADE_SEALED",  # the grader's own pid (course/sandbox.py): never a rank's
    "MINIPAR_GRADE_CALL_TIMEOUT",  # the wall's child, never a rank
    "MINIPAR_GRADE_ISOLATE",  # the wall's child, never a rank
    "MINIPAR_GRADE_COVER",  # read where the pool starts its fork server, never by a rank
    "MINIPAR_EXERCISES_IMPL",  # the folder under test (the grader's; the suite's ranks read it)
    "MINIPAR_EXERCISES",  # the student edition's exercises/ (minipar.exercises.assigned)
)


class Pool:
    def __init__(self):
        self.jobs: dict = {}  # key -> Job, least recently used first
        self.failed: dict = {}  # key -> the last job that did not start, and how many did not
        self.sessions: list[int] = []  # every job's process group (its session), in order;
        # the fork server's too (zygote.py): everything the pool started, to check none outlives it
        self.ranks: list[int] = []  # every rank's process id
        self.zygote: zygote.Server | zygote.Borrowed | None = None  # forks the ranks, torch
        # loaded (zygote.py): this process's own, or a parent's (MINIPAR_FORK_SERVER)

    def run(self, suite, size, backend, names, timeout, case_limit, settings, group_of=None):
        """Run the cases `names` of `suite`; ({name: {rank: result}}, {name: why some ranks
        gave no result}, returncode of a job that ended, the end of its log). With `group_of`
        (name -> group), a case that hangs or kills its job takes the rest of its group with
        it (noted, not run) and its time is not the suite's: one exercise's hang costs that
        exercise only."""
        results, notes, returncode, log = {}, {}, 0, ""
        deadline = time.monotonic() + timeout
        pending = list(names)
        while pending:
            started = time.monotonic()
            job = self._job(size, backend)
            deadline += time.monotonic() - started  # starting a job is not the suite's time
            if job.error is not None:
                notes.update(dict.fromkeys(pending, job.error))
                return results, notes, job.returncode_after_kill(), ""
            if time.monotonic() >= deadline:
                why = f"not run: the suite's timeout of {timeout:g} s was spent"
                notes.update(dict.fromkeys(pending, why))
                return results, notes, returncode, log
            done, broken = job.run(suite, pending, settings, case_limit, deadline)
            results.update(done)
            pending = pending[len(done) :]
            if broken is not None:
                name, partial, why, seconds = broken
                results[name], notes[name] = partial, why
                # the case that broke the job spent its own time, not the later cases': they
                # get the budget they would have had without it, whichever order ran them
                deadline += seconds
                pending = pending[1:]
                returncode, log = job.returncode_after_kill(), job.log_tail()
                if group_of is not None:  # the rest of its group would break it again
                    gone = [n for n in pending if group_of(n) == group_of(name)]
                    notes.update(dict.fromkeys(gone, f"not run: {name} broke its job already"))
                    pending = [n for n in pending if n not in gone]
            if not job.usable:
                self._close(job)
        return results, notes, returncode, log

    def _job(self, size, backend) -> Job:
        """The warm job for this size, transport and launch environment, started if there is
        none (closing others past WARM_RANKS, see _to_close); a job that failed to start twice
        is not tried again."""
        key = (size, backend, tuple((n, os.environ.get(n)) for n in LAUNCH_ENV))
        if self.failed.get(key, (None, 0))[1] >= 2:
            return self.failed[key][0]
        job = self.jobs.pop(key, None)
        if job is not None and not job.usable:  # interrupted mid-batch (pytest's timeout)
            job.close()
            job = None
        if job is None:
            warm = int(os.environ.get(WARM_ENV, WARM_RANKS))
            while self.jobs and sum(j.size for j in self.jobs.values()) + size > warm:
                self._close(self._to_close())
            job = Job(size, backend, self.fork_server())
            self.sessions.append(job.proc.pid)
            self.ranks.extend(job.pids.values())
            if job.error is not None:
                self.failed[key] = (job, self.failed.get(key, (None, 0))[1] + 1)
                job.close()
                return job
        self.jobs[key] = job  # most recently used last
        return job

    def start_fork_server(self) -> None:
        """Start the fork server now without waiting for it (its torch import overlaps what
        this process does before its first job: `minipar grade` collects and runs the
        one-process tests meanwhile); fork_server() waits for it when a job needs it."""
        if zygote.enabled() and self.zygote is None and not os.environ.get(FORK_SERVER_ENV):
            self.zygote = zygote.Server(launch_environ())
            self.sessions.append(self.zygote.proc.pid)

    def fork_server(self):
        """The fork server that starts this session's ranks warm (started on first use; or the
        one MINIPAR_FORK_SERVER names, a parent pytest's), or None: MINIPAR_TEST_ZYGOTE=0, or
        it could not start (the ranks then start cold)."""
        if not zygote.enabled():
            return None
        if self.zygote is None:
            parent = os.environ.get(FORK_SERVER_ENV)
            if parent and os.path.exists(parent):  # a pytest inside a test: the test's server
                self.zygote = zygote.Borrowed(parent)
            else:
                self.zygote = zygote.Server(launch_environ())
                self.sessions.append(self.zygote.proc.pid)
        return self.zygote if self.zygote.ready(START_LIMIT) else None

    def _to_close(self) -> Job:
        """The largest job, the least recently used of those: the small world sizes serve most
        suites, the large ones few (and hold the most memory)."""
        jobs = list(self.jobs.values())  # least recently used first
        return max(jobs, key=lambda job: (job.size, -jobs.index(job)))

    @property
    def launches(self) -> int:
        """Jobs started (the fork server is not one)."""
        own_server = self.zygote is not None and self.zygote.proc is not None
        return len(self.sessions) - own_server

    def _close(self, job) -> None:
        for key, other in list(self.jobs.items()):
            if other is job:
                del self.jobs[key]
        job.close()

    def close(self) -> list[tuple[int, str, int]]:
        """Ask every warm job to quit, then end it; (size, backend, exit status) of each: 0
        when its ranks finalized minipar, the end-of-job comparison of the calls included
        (comm/guards/ending.py), and exited by themselves."""
        jobs = list(self.jobs.values())
        self.jobs.clear()
        for job in jobs:
            job.ask_to_quit()
        for job in jobs:
            job.close()
        if self.zygote is not None:
            self.zygote.close()
        return [(job.size, job.backend, job.proc.returncode) for job in jobs]


class Job:
    """One warm job of `size` ranks; `error` says why it did not start, if it did not."""

    def __init__(self, size: int, backend: str, fork_server=None):
        self.size, self.backend, self.fork_server = size, backend, fork_server
        self.folder = own_folder.make("pool")  # named after us: a killed session's is swept
        self.log = open(os.path.join(self.folder, "job.log"), "w+")
        self.conns: dict[int, wire.Connection] = {}
        self.pids: dict[int, int] = {}
        self.segments: set[str] = set()  # the /dev/shm segments its ranks were seen to map
        self.usable, self.error, self.returncode = True, None, None
        self.last_words = ""  # why the job did not end well, once closed (close())
        self.env = launch_environ()
        self.selector = selectors.DefaultSelector()
        self._inbox: dict[int, list] = {r: [] for r in range(size)}
        self._closed: list[int] = []  # ranks whose connection closed, in that order
        self._start()

    # -- starting --------------------------------------------------------------------------
    def _start(self) -> None:
        listener = socket.create_server(("127.0.0.1", 0), backlog=self.size)
        token = secrets.token_hex(16)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        argv = ["-m", "minipar.testing.server", address, self.folder,
                "--backend", self.backend, "--size", str(self.size)]  # fmt: skip
        if self.fork_server is not None:
            argv = self.fork_server.wrap(argv)
        if self.backend == "mpi":
            cmd, env = launcher.command(self.size, argv, warm=False)  # (its own server)
        else:
            cmd, env = [sys.executable, *argv], dict(os.environ, PYTHONUNBUFFERED="1")
            env.setdefault("OMP_NUM_THREADS", "1")
            env.setdefault("MINIPAR_OVERSUBSCRIBED", "1")
        env.update(self.env, **{wire.TOKEN_ENV: token})
        self.proc = subprocess.Popen(
            cmd, env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            self._accept(listener, token)
        except BaseException:  # interrupted while starting: leave nothing running (at once:
            self.usable = False  # a rank not yet connected could not be asked to quit)
            self.close()
            raise
        finally:
            listener.close()

    def _accept(self, listener, token: str) -> None:
        deadline = time.monotonic() + START_LIMIT
        listener.settimeout(0.2)
        while len(self.conns) < self.size:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = "exited" if self.proc.poll() is not None else f"took over {START_LIMIT:g} s"
                self.error = (f"the warm job of {self.size} ranks ({self.backend}) did not start: "
                              f"it {why} with {len(self.conns)} of {self.size} ranks ready\n"
                              f"--- job log ---\n{self.log_tail()}"
                              + self.outputs(range(self.size)))  # fmt: skip
                self.usable = False
                self.kill()
                return
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            sock.settimeout(60)  # a rank says hello as soon as it has connected
            conn = wire.Connection(sock)
            try:
                hello = conn.receive()
            except OSError:
                hello = None
            sock.settimeout(None)
            if not hello or hello.get("token") != token:
                conn.close()
                continue
            self.conns[hello["rank"]], self.pids[hello["rank"]] = conn, hello["pid"]
            self.selector.register(conn, selectors.EVENT_READ, hello["rank"])
        self._seen_segments()

    def _seen_segments(self) -> None:
        """Note the shared-memory segments the ranks map now (MPICH's, made at MPI_Init, and
        the windows of the cases so far): a rank that dies (MPI_Abort, os._exit, killed)
        frees none of them, and by then its maps cannot be read (kill() removes them)."""
        self.segments |= shm_leftovers.mapped(self.pids.values())

    # -- one batch -------------------------------------------------------------------------
    def run(self, suite, names, settings, case_limit, deadline):
        """({name: {rank: result}} for the cases every rank finished, then None or
        (name, its partial results, why the others gave none, its seconds) for the case that
        broke the job)."""
        env, unset = batch_environ(self.env)
        request = {"op": "run", "suite": suite, "names": names, "env": env, "unset": unset,
                   **settings}  # fmt: skip
        try:
            if not self._send(request):  # the job ended while it waited (killed, out of memory)
                self.usable = False
                return {}, None
            done = {}
            for name in names:
                began = time.monotonic()
                limit = min(began + case_limit, deadline)
                results, broken = self._one_case(name, limit)
                self._seen_segments()
                if broken is not None:
                    return done, (name, results, broken, time.monotonic() - began)
                done[name] = results
                if not self.usable:
                    return done, None
            self._wait_done(time.monotonic() + case_limit)
            return done, None
        except BaseException:  # pytest's own timeout, Ctrl-C, a garbled answer: the job is
            self.usable = False  # mid-batch and cannot serve another one
            raise

    def _send(self, request) -> bool:
        if self.proc.poll() is not None:
            return False
        try:
            for conn in self.conns.values():
                conn.send(request)
        except OSError:
            return False
        return True

    def _one_case(self, name, limit):
        """Every rank's result of case `name`, and None, or why some ranks gave none."""
        start, results, synced = time.monotonic(), {}, {}
        while len(synced) < self.size:
            waiting = [r for r in range(self.size) if r not in synced]
            got = self._next(limit, waiting)
            if got is None:
                return results, self._hung(results, synced, time.monotonic() - start)
            rank, message = got
            if message is EOFError:
                return results, self._died(name, results, synced)
            if message.get("name") != name:
                raise RuntimeError(f"rank {rank} answered {message} while {name} was due")
            if message["op"] == "case":
                results[rank] = _result(message)
            elif message["op"] == "synced":
                synced[rank] = message
        verdict = synced[0]
        if verdict["error"]:
            for result in results.values():
                result["ok"] = False
                result["error"] = (result["error"] or "") + "\n" + verdict["error"]
        if any(message["rebuild"] for message in synced.values()):
            self.usable = False
        return results, None

    def _wait_done(self, limit) -> None:
        waiting = set(range(self.size))
        while waiting:
            got = self._next(limit, waiting)
            if got is None or got[1] is EOFError or got[1]["op"] != "done":
                self.usable = False
                return
            waiting.discard(got[0])
            if got[1]["rebuild"]:
                self.usable = False

    def _next(self, limit, ranks):
        """(rank, message) from one of `ranks`, in the order each rank sent them, or
        (rank, EOFError) once a rank's connection has closed, or None past `limit`."""
        while True:
            for rank in ranks:
                if self._inbox[rank]:
                    return rank, self._inbox[rank].pop(0)
            if self._closed:
                return self._closed[0], EOFError
            left = limit - time.monotonic()
            if left <= 0:
                return None
            self._read(min(left, 1.0))

    def _read(self, seconds: float) -> None:
        for key, _ in self.selector.select(timeout=seconds):
            try:
                self._inbox[key.data].extend(key.fileobj.ready())
            except (EOFError, OSError):
                self.selector.unregister(key.fileobj)
                self._closed.append(key.data)

    # -- when a case breaks the job ---------------------------------------------------------
    def _hung(self, results, synced, seconds) -> str:
        stuck = [r for r in range(self.size) if r not in results]
        where = "inside the case"
        if not stuck:
            stuck, where = [r for r in range(self.size) if r not in synced], "after the case"
        self.dump_stacks(stuck)
        self.kill()
        return (f"ranks {stuck} were still {where} {seconds:.0f} s after it began (hung; the "
                "limit is the suite's CASE_LIMIT or minipar.testing.pool.CASE_LIMIT, or what "
                "was left of run_suite's timeout); the job was killed and a fresh one runs the "
                "remaining cases" + self.outputs(stuck))  # fmt: skip

    def _died(self, name, results, synced) -> str:
        """The job ended during case `name`: the ranks that never answered it are named (their
        results stay missing); a rank that answered but died before the notes were compared
        (MPI_Abort returns first in MPICH, then the job ends) gets its result failed."""
        self._drain(time.monotonic() + 5.0)  # answers already on their way, and the job's end
        for rank in range(self.size):
            for message in self._inbox[rank]:
                if message.get("name") != name:
                    continue
                if message["op"] == "case":
                    results[rank] = _result(message)
                elif message["op"] == "synced":
                    synced[rank] = message
        missing = [r for r in range(self.size) if r not in results]
        first = self._closed[0]
        self.kill()
        ended = (f"the job ended (rank {first}'s connection closed first; job exit "
                 f"{self.proc.returncode}); a fresh job runs the remaining cases")  # fmt: skip
        log = f"\n--- job log ---\n{self.log_tail()}"
        if missing:
            return f"ranks {missing} died in the case: {ended}{self.outputs(missing)}{log}"
        for rank, result in results.items():
            if rank not in synced:
                result["ok"] = False
                result["error"] = (f"rank {rank} finished the case, but {ended} before the "
                                   f"ranks compared notes after it{log}")  # fmt: skip
                result["output"] = case.read_tail(self.capture(rank), 6000)
        return ended

    def _drain(self, limit) -> None:
        """Read every connection until it closes (the job is ending), or until `limit`."""
        while len(self._closed) < self.size and time.monotonic() < limit:
            self._read(0.1)

    def dump_stacks(self, ranks) -> None:
        """Have each rank print every thread's stack (faulthandler on SIGUSR1)."""
        for rank in ranks:
            try:
                os.kill(self.pids[rank], signal.SIGUSR1)
            except (KeyError, ProcessLookupError):
                pass
        time.sleep(DUMP_WAIT)

    def outputs(self, ranks) -> str:
        return "".join(
            f"\n--- rank {rank} output ---\n{case.read_tail(self.capture(rank), 6000)}"
            for rank in ranks
        )

    def capture(self, rank: int) -> str:
        return os.path.join(self.folder, f"rank{rank}.out")

    def log_tail(self, chars: int = 4000) -> str:
        if not self.log.closed:
            self.log.flush()
        return case.read_tail(self.log.name, chars)

    def returncode_after_kill(self) -> int:
        return self.proc.returncode if self.proc.returncode is not None else -9

    # -- ending ----------------------------------------------------------------------------
    def ask_to_quit(self) -> None:
        for conn in self.conns.values():
            try:
                conn.send({"op": "quit"})
            except OSError:
                pass

    def kill(self) -> None:
        """End the job (launcher/stop.py: SIGTERM, then SIGKILL): its process group, and each
        rank (MPICH's hydra starts every rank in a session of its own, so the group alone would
        leave them to hydra's proxies)."""
        self.usable = False
        stop.stop(self.proc, ranks=self.pids.values())
        shm_leftovers.remove(self.segments, self.pids.values())

    def close(self, grace: float = 10.0) -> None:
        """Ask the ranks to leave, wait a little, then kill what is left; remove the folder.
        A job that did not end well keeps the end of its log and the ranks' output (with
        their stacks, if they did not leave in time) in `last_words`."""
        late = False
        try:
            late = self.proc.poll() is None and self.usable and not self._quits(grace)
        finally:  # interrupted while it waits (Ctrl-C, SIGTERM): the job and its folder still go
            self.kill()
            if self.proc.returncode != 0:
                self.last_words = (
                    f"{'still running after' if late else 'ended within'} {grace:g} "
                    f"s of quit\n{self.log_tail()}{self.outputs(range(self.size))}"
                )
            for conn in self.conns.values():
                conn.close()
            self.selector.close()
            self.log.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    def _quits(self, grace: float) -> bool:
        """Ask the ranks to quit; whether the job ended within `grace` s (if not, the ranks
        print their stacks first)."""
        self.ask_to_quit()
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.dump_stacks(range(self.size))
            return False
        return True


def _result(message: dict) -> dict:
    return {k: message[k] for k in ("ok", "error", "output", "seconds")}


def launch_environ() -> dict:
    """The environment a job starts with: this process's, MINIPAR_TIMEOUT defaulted."""
    env = dict(os.environ)
    env.setdefault("MINIPAR_TIMEOUT", CASE_TIMEOUT)
    return env


def batch_environ(launched: dict) -> tuple[dict, list]:
    """(variables to set, variables to unset) so that a rank sees this process's environment
    now, as it differs from the one its job started with."""
    now = launch_environ()
    env = {k: v for k, v in now.items() if launched.get(k) != v}
    return env, [k for k in launched if k not in now]
