"""What a case may not leave behind for the next one on a warm rank (minipar.testing.server).

After every case, on every rank:
- this process's minipar state (`minipar.state.process`) goes back to the batch's: open
  `minipar.trace()` ledgers, saved-activation counters, the grader's recordings and registered
  stalls are dropped; debug mode, the fast-paths switch, mismatch_after and the default group's
  timeout are set to the batch's (MINIPAR_DEBUG, MINIPAR_FAST_PATHS, MINIPAR_MISMATCH_AFTER,
  MINIPAR_TIMEOUT); the cost links are the batch's again; minipar is initialised again if the
  case finalized it;
- environment variables, the working directory, sys.stdout and sys.stderr, torch's default
  dtype and grad mode are put back as they were before the case, and the random generators
  of torch, numpy and `random` are seeded with SEED: every case starts from the same draws on
  every rank, whichever cases ran before it (a fresh process seeds torch at random,
  differently on each rank);
- the ranks compare notes over the harness's control group: each one's account of the default
  group, the calls it made (`_seq`), their chained history (`_history`, which every
  collective's tag carries, comm/transport/base.py) and the groups split from it (`_splits`, which
  every group id counts). Unequal accounts after a case that passed everywhere fail that case (a
  rank made a collective call the others did not, or another one: the first call where they part
  is named, as the end-of-job comparison would, comm/guards/ending.py), and the remaining cases go
  to a fresh job: such calls leave messages nobody will receive, which the watchdog could take
  for a mismatch during a later case. After a failure the accounts are realigned to the rank
  that made the most calls, and the table of recent calls is emptied, so that one failure does
  not make every later case time out, the watchdog does not take a failed case's leftover
  messages for a mismatch in a later one, and the end-of-job comparison (finalize() when the
  job quits) finds the ranks in step.
- a default group that cannot be trusted any more (a mismatch the watchdog reported, a control
  call abandoned inside MPI, async work that never finished, shared windows or the windows of
  its `minipar.empty` buffers out of step, minipar
  not restartable) fails the case and has the pool start a fresh job for the remaining cases.

After every batch (one suite): the suite and the helper modules it imported are dropped, the
algorithm tables lose what the cases registered, the groups the cases made are freed once
nothing holds them (testing/groups.py), sys.path and the environment are restored.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

from minipar import runtime
from minipar.collectives import registry
from minipar.comm.guards import ending
from minipar.comm.transport.base import env_mismatch_after
from minipar.runtime.world import FAST_PATHS_ENV
from minipar.state import process
from minipar.testing.groups import GroupTracker

CONTROL_SLACK = 5  # seconds beyond 3 timeouts the control group waits for a slow rank
SEED = 0  # torch, numpy and random start every case seeded with it, on every rank


class Isolation:
    def __init__(self, backend: str, control):
        self.backend, self.control = backend, control
        self.world = runtime.default_group()
        self.groups = GroupTracker(type(self.world))
        self.launch_environ = dict(os.environ)
        self.algorithms = {c: dict(table) for c, table in registry.ALGORITHMS.items()}
        self.timeout, self.debug = self.world.timeout, False
        self.fast_paths, self.mismatch_after = process.fast_paths, process.mismatch_after
        self.links = dict(process.links)
        self.modules, self.path = set(sys.modules), list(sys.path)
        self.saved = _Saved()

    # -- a batch -------------------------------------------------------------------------
    def begin_batch(self, request: dict) -> None:
        """The batch's environment (the pytest process's, as it differs from the launch one),
        timeout, debug mode, fast-paths switch and mismatch_after."""
        for name in request.get("unset", []):
            os.environ.pop(name, None)
        os.environ.update(request.get("env", {}))
        self.timeout = float(request.get("timeout") or self.timeout)
        self.debug = os.environ.get("MINIPAR_DEBUG") == "1"
        self.fast_paths = fast_paths_from_env()
        self.mismatch_after = env_mismatch_after()
        self._settings()
        self.control.timeout = 3 * self.timeout + CONTROL_SLACK
        self.links = dict(process.links)
        self.modules, self.path = set(sys.modules), list(sys.path)

    def _settings(self):
        """The batch's settings on the running world (init changes only what it is passed)."""
        return runtime.init(timeout=self.timeout, debug=self.debug, fast_paths=self.fast_paths,
                            mismatch_after=self.mismatch_after)  # fmt: skip

    def snapshot(self) -> None:
        """What every case of the batch starts from (taken once the suite is loaded)."""
        self.saved = _Saved()
        _seed(SEED)

    def end_batch(self, folder: str) -> None:
        """Forget the suite's helper modules, free the groups, restore the tables and env."""
        for name in set(sys.modules) - self.modules:
            if _inside(getattr(sys.modules[name], "__file__", None), folder):
                del sys.modules[name]
        for collective, table in registry.ALGORITHMS.items():  # before the groups: a case's
            table.clear()  # algorithm may hold its suite, and the suite its groups
            table.update(self.algorithms[collective])
        self.groups.free_unused(self.control)
        for gid, ref in list(process.groups.items()):  # the freed groups' entries
            if ref() is None:
                del process.groups[gid]
        sys.path[:] = self.path
        _restore_environ(self.launch_environ)

    # -- a case ----------------------------------------------------------------------------
    def after_case(self, ok: bool) -> dict:
        """Reset this rank, then compare notes with the others: {"error", "rebuild"}."""
        problems = self._reset()
        world = self.world
        mine = {"ok": ok, "problems": problems, "shm": _shm_state(world),
                "world": None if world is None else account(world)}  # fmt: skip
        notes = self.control.allgather_object(mine, "the harness comparing notes after a case")
        return self._verdict(notes)

    def _reset(self) -> list[str]:
        problems = _wait_idle(self.timeout)  # before the stalls go: the progress thread's
        problems += _drop_case_state(self.links)
        self.saved.restore()
        self.groups.after_case()
        if not runtime.is_initialized():
            try:
                runtime.init(backend=self.backend)
            except Exception as error:  # noqa: BLE001
                self.world = None
                return [f"minipar.init() failed after the case finalized minipar: {error}"]
        self.world = self._settings()
        return problems + _unusable(self.world, self.control)

    def _verdict(self, notes: list[dict]) -> dict:
        errors, rebuild = [], False
        for rank, note in enumerate(notes):
            for problem in note["problems"]:
                errors.append(f"rank {rank}: {problem}")
                rebuild = True
        if len({note["shm"] for note in notes}) > 1:
            rounds = {r: n["shm"] for r, n in enumerate(notes)}
            errors.append("the default group's shared-memory rounds, or the windows its buffers "
                          f"live in, differ (round, windows made): {rounds}")  # fmt: skip
            rebuild = True
        accounts = [note["world"] for note in notes]
        if self.world is not None and None not in accounts:
            differs = compare(accounts)
            if differs is not None:
                realign(self.world, max(accounts, key=lambda a: a["seq"]))
                if all(note["ok"] for note in notes):  # mismatched calls every rank returned
                    errors.append(differs)  # from: their messages are nobody's, and the
                    rebuild = True  # watchdog may fail the group over them in a later case
        return {"error": "\n".join(errors) or None, "rebuild": rebuild}


# -- the default group's account: what the ranks compare after a case ----------------------------
def account(world) -> dict:
    """What this rank says about the default group after a case (plain values)."""
    return {"seq": world._seq, "history": world._history, "splits": world._splits,
            "summary": ending.summary(world)}  # fmt: skip


def compare(accounts: list[dict]) -> str | None:
    """Why the ranks' accounts of the default group differ, or None when they agree."""
    seqs = [a["seq"] for a in accounts]
    if len(set(seqs)) > 1:
        counts = ", ".join(f"rank {r}: {s}" for r, s in enumerate(seqs))
        return (f"after this case the ranks disagree on how many collective calls the default "
                f"group made ({counts}): some rank made a call the others did not; "
                + _difference(accounts))  # fmt: skip
    if len({a["history"] for a in accounts}) > 1:
        return ("after this case the ranks' histories of the default group differ (as many "
                "calls, not the same ones): " + _difference(accounts))  # fmt: skip
    splits = [a["splits"] for a in accounts]
    if len(set(splits)) > 1:
        counts = ", ".join(f"rank {r}: {s}" for r, s in enumerate(splits))
        return f"after this case the ranks made different numbers of groups ({counts})"
    return None


def _difference(accounts: list[dict]) -> str:
    """The first call where rank 0 and the first rank unlike it part (in the words of
    comm/guards/ending.py)."""
    first = accounts[0]["summary"]
    for other in accounts[1:]:
        summary = other["summary"]
        if (first[4], first[5]) != (summary[4], summary[5]):
            return ending.difference(first, summary)
    return ""


def realign(world, model: dict) -> None:
    """Put this rank's default group in step with `model` (a rank's account): the next call's
    number and tag, and the next group's id, agree on every rank again. The table of recent
    calls is emptied: a failed case's leftover messages match none of them (the watchdog looks
    only at recent calls), and no later question is answered from calls a peer never made."""
    world._seq, world._history, world._splits = model["seq"], model["history"], model["splits"]
    world._calls = [None] * len(world._calls)
    world._told = False  # in step again: the end-of-job comparison may look at it (ending.py)
    asked = getattr(world, "_asked", None)
    if asked is not None:
        asked.clear()


# -- what a case may change in this process -------------------------------------------------------
def _drop_case_state(links: dict) -> list[str]:
    """minipar's per-process state a case may leave (minipar.state.process), back to the
    batch's: no open traces (but `minipar run --trace`'s own), counters, recordings; the cost
    links the batch started with. A wait still registered by a live thread (a case's thread
    still inside minipar) is a problem: that thread will make calls the next case does not."""
    keep = process.run_trace[0] if process.run_trace is not None else None
    process.traces[:] = [trace for trace in process.traces if trace is keep]
    process.memory_counters.clear()
    process.memory_layers.clear()
    process.explaining.clear()
    process.links.clear()
    process.links.update(links)
    alive = {thread.ident for thread in threading.enumerate()}
    for ident in [i for i in process.stalls if i not in alive]:
        del process.stalls[ident]
    return [f"a thread is still waiting after the case: {stall.describe()['what']}"
            for stall in list(process.stalls.values())]  # fmt: skip


def _wait_idle(seconds: float) -> list[str]:
    """Wait (up to `seconds`) for the async collectives a case left queued or running."""
    deadline = time.monotonic() + seconds
    while process.progress is not None and not process.progress.idle():
        if time.monotonic() > deadline:
            return [f"async collectives still running {seconds:g} s after the case"]
        time.sleep(0.01)
    return []


def fast_paths_from_env() -> bool:
    """MINIPAR_FAST_PATHS as init() reads it for a new world (0, off, false: off)."""
    return os.environ.get(FAST_PATHS_ENV, "1").strip().lower() not in ("0", "off", "false")


class _Saved:
    """What a case may change in this process and is cheap to put back."""

    def __init__(self):
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.streams = (sys.stdout, sys.stderr)
        torch = sys.modules.get("torch")
        self.torch = None
        if torch is not None:
            self.torch = (torch.get_default_dtype(), torch.is_grad_enabled())

    def restore(self) -> None:
        _restore_environ(self.environ)
        if os.getcwd() != self.cwd:
            os.chdir(self.cwd)
        sys.stdout, sys.stderr = self.streams
        _seed(SEED)
        torch = sys.modules.get("torch")
        if torch is not None:  # imported by the case itself (a light job): torch's defaults
            dtype, grad = self.torch or (torch.float32, True)
            torch.set_default_dtype(dtype)
            torch.set_grad_enabled(grad)


def _seed(seed: int) -> None:
    """The same generators on every rank, whatever the case before drew or seeded. torch's
    CPU generator directly, and CUDA's once CUDA is up: torch.manual_seed would also queue a
    seed for every device kind not yet started, recording the caller's stack each time (about
    0.2 ms a case, on every rank)."""
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.random.default_generator.manual_seed(seed)
        if torch.cuda.is_initialized():
            torch.cuda.manual_seed_all(seed)


def _restore_environ(saved: dict) -> None:
    for name in [n for n in os.environ if n not in saved]:
        del os.environ[name]
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _inside(path, folder: str) -> bool:
    return bool(path) and os.path.abspath(path).startswith(os.path.abspath(folder) + os.sep)


def _shm_state(world):
    """(rounds, windows made for buffers) of the default group's shared-memory node: both
    count collective steps (an in-place round names its window by serial number)."""
    node = getattr(world, "_shm_node", None)
    return (node.round, node.windows_made) if node else None


def _unusable(world, control) -> list[str]:
    """Why the default group (or the harness's own) cannot serve another case, if it cannot."""
    problems = []
    for group in (world, control):
        if getattr(group, "_failure", None) is not None:
            problems.append(f"group {group.name} failed: {group._failure}")
        if getattr(group, "_control_spent", None) is not None:
            problems.append(f"group {group.name}'s control calls are spent: {group._control_spent}")
    return problems
