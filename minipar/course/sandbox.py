"""The grader's wall: a student's code runs in processes of its own, the grade is decided outside.

    grader (pytest, the tests' checks, the results)          student's process (its code only)
      mod = exercises.load("ex10_moe_dispatch", DIR)  --->  python -m minipar.course.sandbox DIR
      mod.sort_by_expert(experts, kept, 4)   -- JSON -->    runs it, nothing else
      compares, in the grader's own process  <-- JSON --    the value, or the error's name

A one-process exercise's functions run in one child per submission (`Wall`; the tests take the
module from `exercise()`): the grader's process never imports the student's file, sends the
arguments and reads back plain values
(course/codec.py: no pickle), each call within CALL_TIMEOUT seconds; a call that hangs is
stopped with its stack named, a process that ends (os._exit, a crash) fails that call only.
The ranks of a multi-rank exercise are processes of their own already (testing/harness.py).

In every process that runs student code, `guard()` installs an audit hook (it cannot be
removed): opening a hidden path (the worked answers, the hidden tests, the results) and starting
or replacing processes are refused. Where the grader runs as root, those processes also run as
an unprivileged user in a mount namespace where the hidden paths are empty (`isolated()`):
the walls are listed in docs/course.md, with what they cannot stop.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time

from minipar import exercises
from minipar.exercises import COVER_ENV, HIDE_ENV, guard, hidden_paths  # noqa: F401 (grade.py)
from minipar.launcher import stop

SEALED_ENV = "MINIPAR_GRADE_SEALED"  # the grader's pid: its exercise modules come through a Wall
TIMEOUT_ENV = "MINIPAR_GRADE_CALL_TIMEOUT"
IMPL_ENV = "MINIPAR_EXERCISES_IMPL"  # the folder being graded (the grader sets it; graded() reads)
CALL_TIMEOUT = 10.0  # seconds one call of a student's function may take
LOAD_TIMEOUT = 30.0  # ... and starting its process and loading its file (torch: seconds)
BUILTIN = {
    e.__name__: e
    for e in (NotImplementedError, ValueError, TypeError, IndexError, KeyError, AssertionError,
              RuntimeError, ZeroDivisionError, ArithmeticError, AttributeError, OverflowError,
              RecursionError, MemoryError, LookupError, StopIteration)
}  # fmt: skip


def sealed() -> bool:
    """Whether this process is the grader's own: it loads no student's file (`load` below)."""
    return os.environ.get(SEALED_ENV) == str(os.getpid())


# -- the grader's side --------------------------------------------------------------------------


def isolated(hidden: list[str]) -> list[str]:
    """The command prefix that runs a student's process apart: as root, in a mount namespace
    where every hidden path is covered, as the unprivileged user `nobody`, or where `nobody`
    cannot reach this Python, as root's uid without a capability; otherwise in a user
    namespace of its own; where the machine refuses all (a container without the right),
    nothing: the audit hook stays."""
    return next((prefix for prefix in _choices(hidden) if exercises.runs(prefix)), [])


def _choices(hidden: list[str]) -> list[list[str]]:
    if os.environ.get(exercises.ISOLATE_ENV) == "0":
        return []
    if os.geteuid() == 0:
        return [exercises.apart(hidden, exercises.NOBODY), exercises.apart(hidden)]
    unshare = shutil.which("unshare")
    if not unshare:
        return []
    return [[unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
             exercises.COVER + 'exec "$@"', "sh", *hidden, "--"]]  # fmt: skip


class Wall:
    """One child process serving a folder's exercise functions to the grader, call by call."""

    def __init__(self, folder: str, timeout: float | None = None):
        self.folder, self.hidden = folder, hidden_paths()  # as the grader set them now
        self.broken: dict[str, Exception] = {}  # module -> why loading it failed for good
        self.timeout = timeout or float(os.environ.get(TIMEOUT_ENV) or CALL_TIMEOUT)
        self.child, self.errors, self.drainer = None, [], None

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != SEALED_ENV}
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written beside a student's files
        env[HIDE_ENV] = os.pathsep.join(self.hidden)
        command = [sys.executable, "-m", "minipar.course.sandbox", self.folder, str(os.getpid())]
        self.child = subprocess.Popen(
            isolated(self.hidden) + command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, start_new_session=True, cwd=self.folder,
        )  # fmt: skip
        self.errors = []
        self.drainer = threading.Thread(target=self._drain, args=(self.child,), daemon=True)
        self.drainer.start()

    def _drain(self, child) -> None:
        for line in child.stderr:  # what the student printed, and a stack when asked
            self.errors.append(line.decode(errors="replace"))
            del self.errors[:-200]

    def close(self) -> None:
        if self.child is not None:
            _end(self.child)
            self.child = None

    def call(self, module: str, what: dict):
        """Send one request; the reply's JSON value, or the student's error raised here. A
        module whose loading hung or ended the process fails at once from then on (each of its
        tests would wait out the limit again)."""
        if module in self.broken:
            raise type(self.broken[module])(str(self.broken[module]))
        if self.child is None or self.child.poll() is not None:
            self._start()
        nonce = secrets.token_hex(8)
        request = json.dumps({"id": nonce, "module": module, **what}) + "\n"
        try:
            self.child.stdin.write(request.encode())
            self.child.stdin.flush()
            line = self._reply(module, what)
        except BrokenPipeError:  # it ended before reading the request
            try:
                self.child.wait(2.0)
            except subprocess.TimeoutExpired:
                pass
            error = RuntimeError(f"{module}: your code ended its process{self._tail()}")
            self.close()
            raise error from None
        except (TimeoutError, RuntimeError) as error:
            if what.get("get", "") is None:  # loading the file itself
                self.broken[module] = error
            raise
        reply = json.loads(line)
        if reply.get("id") != nonce:
            raise RuntimeError(f"{module}: a reply the grader did not ask for")
        if "error" in reply:
            error = reply["error"]
            kind = BUILTIN.get(error.get("type"), RuntimeError)
            said = error.get("message", "")
            message = said if kind is not RuntimeError else f"{error.get('type')}: {said}"
            raise kind(message)
        return reply["value"]

    def _reply(self, module: str, what: dict) -> bytes:
        selector = selectors.DefaultSelector()
        selector.register(self.child.stdout, selectors.EVENT_READ)
        limit = max(self.timeout, LOAD_TIMEOUT) if "get" in what else self.timeout
        if selector.select(limit):
            line = self.child.stdout.readline()
            if line:
                return line
            code = self.child.wait()
            raise RuntimeError(
                f"{module}.{what.get('call', what.get('get'))}: your code ended its process "
                f"(exit status {code}) before returning{self._tail()}"
            )
        where = self._stack()
        self.close()
        raise TimeoutError(
            f"{module}.{what.get('call') or 'loading the file'} did not return within {limit:g} s "
            f"(a loop that never ends?){where}"
        )

    def _stack(self) -> str:
        """The student's process's stack, from faulthandler (SIGUSR1), as ': at FILE:LINE'."""
        before = len(self.errors)
        try:
            os.kill(self.child.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return ""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not any("File" in e for e in self.errors[before:]):
            time.sleep(0.05)
        frames = [e.strip() for e in self.errors[before:] if e.strip().startswith("File")]
        student = [f for f in frames if self.folder in f] or frames
        return f"; it was at {student[0]}" if student else ""

    def _tail(self) -> str:
        if self.child is not None and self.child.poll() is not None:
            self.drainer.join(2.0)  # it ended: its last lines may still be in the pipe
        text = "".join(self.errors[-5:]).strip()
        return f"; it printed: {text.splitlines()[-1]}" if text else ""


def _end(child) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()
    child.wait()
    for stream in (child.stdin, child.stdout):
        stream.close()


class SealedModule:
    """A student's exercise module seen from the grader: each function a call through the
    Wall, each constant its value."""

    def __init__(self, wall: Wall, name: str):
        self._wall, self._name = wall, name

    def __getattr__(self, attr: str):
        if attr.startswith("_"):
            raise AttributeError(attr)
        kind = self._wall.call(self._name, {"get": attr})
        from minipar.course import codec  # numpy: only when values cross

        if kind != "function":
            return codec.decode(kind["value"])

        def forward(*args, **kwargs):
            payload = {"call": attr, "args": codec.encode(list(args))}
            reply = self._wall.call(self._name, {**payload, "kwargs": codec.encode(kwargs)})
            return codec.decode(reply)

        forward.__name__ = attr
        return forward


_WALLS: dict[str, Wall] = {}


def exercise(name: str, which: str):
    """Exercise `name` of a tree, as the exercises' one-process tests use it: the worked
    answers imported as they are; a student's file, in the grader's own process, seen through
    its Wall; anywhere else (a pytest run of one's own) imported (minipar.exercises.load)."""
    folder = exercises.tree(which)
    if folder == exercises.tree("solutions") or not sealed():
        return exercises.load(name, which)
    if not (folder / f"{name}.py").exists():
        raise FileNotFoundError(f"no exercise {name} in {folder}")
    return load(name, str(folder))


def graded(name: str):
    """Exercise `name` of the folder being graded (MINIPAR_EXERCISES_IMPL), for an instructor's
    hidden tests (`minipar grade --hidden-tests DIR`): `mod = sandbox.graded("ex12_...")`."""
    return exercise(name, os.environ.get(IMPL_ENV, "solutions"))


def load(name: str, folder: str) -> SealedModule:
    """Exercise `name` of `folder` as the grader sees it (one Wall per folder)."""
    wall = _WALLS.get(folder) or _WALLS.setdefault(folder, Wall(folder))
    wall.call(name, {"get": None})  # its file loads (or fails) now, as an import would
    return SealedModule(wall, name)


def close_all() -> None:
    for wall in _WALLS.values():
        wall.close()
    _WALLS.clear()


# -- the student's side ------------------------------------------------------------------------


def _answer(modules: dict, folder: str, request: dict):
    from minipar.course import codec  # numpy: only when values cross

    name = request["module"]
    if name not in modules:
        modules[name] = exercises.load(name, folder)
    module = modules[name]
    if "get" in request:
        if request["get"] is None:
            return None
        value = getattr(module, request["get"])
        return "function" if callable(value) else {"value": codec.encode(value)}
    fn = getattr(module, request["call"])
    return codec.encode(fn(*codec.decode(request["args"]), **codec.decode(request["kwargs"])))


def serve(folder: str, grader: int | None = None) -> None:
    """Answer the grader's requests, one JSON line each, on the stdout this process started
    with (what the student prints goes to stderr). With `grader` (its pid), this process dies
    with it."""
    import faulthandler
    import traceback

    if grader is not None:
        _die_with(grader)

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    guard()
    modules: dict = {}
    for line in sys.stdin:
        request = json.loads(line)
        reply = {"id": request.get("id")}
        try:
            reply["value"] = _answer(modules, folder, request)
        except BaseException as error:  # noqa: BLE001 - every failure goes back by name
            if isinstance(error, KeyboardInterrupt):
                raise
            reply["error"] = {"type": type(error).__name__, "message": str(error)[:4000]}
            traceback.print_exc()
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def _die_with(grader: int) -> None:
    """SIGKILL this process when the grader dies (Linux's PR_SET_PDEATHSIG; set here, after
    setpriv changed who we are, which clears it): a SIGKILLed grader runs no clean-up, and a
    student's endless loop would spin on with nobody to read its answer."""
    if not stop.die_with_parent():
        return
    if os.getppid() != grader:  # it died before we asked
        os._exit(1)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
