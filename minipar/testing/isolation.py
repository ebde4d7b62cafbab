"""What a case may not leave behind for the next one on a warm rank (minipar.testing.server).

After every case, on every rank:
- `minipar.trace()` blocks left open are closed; debug mode and the default group's timeout go
  back to the batch's settings (MINIPAR_DEBUG, MINIPAR_TIMEOUT); minipar is initialised again
  if the case finalized it;
- environment variables, the working directory, sys.stdout and sys.stderr, torch's default
  dtype and grad mode are put back as they were before the case, and the random generators
  of torch, numpy and `random` are seeded with SEED: every case starts from the same draws on
  every rank, whichever cases ran before it (a fresh process seeds torch at random,
  differently on each rank);
- the ranks compare notes over the harness's control group: each one's call counter on the
  default group (`comm._seq`, which every collective's tag carries). Unequal counters after a
  case that passed everywhere fail that case (a rank made a collective call the others did
  not); after any failure they are realigned to the largest, so one failure does not make
  every later case time out.
- a default group that cannot be trusted any more (a mismatch the watchdog reported, a control
  call abandoned inside MPI, async work that never finished, shared windows out of step, minipar
  not restartable) fails the case and has the pool start a fresh job for the remaining cases.

After every batch (one suite): the suite and the helper modules it imported are dropped, the
algorithm tables lose what the cases registered, the groups the cases made are freed once
nothing holds them (testing/groups.py), sys.path and the environment are restored.
"""

from __future__ import annotations

import os
import random
import sys
import time

from minipar.testing.groups import GroupTracker

CONTROL_SLACK = 5  # seconds beyond 3 timeouts the control group waits for a slow rank
SEED = 0  # torch, numpy and random start every case seeded with it, on every rank


class Isolation:
    def __init__(self, backend: str, control):
        import minipar
        from minipar.collectives import registry

        self.backend, self.control = backend, control
        self.world = minipar.init()
        self.groups = GroupTracker(type(self.world))
        self.launch_environ = dict(os.environ)
        self.algorithms = {c: dict(table) for c, table in registry.ALGORITHMS.items()}
        self.timeout, self.debug = self.world.timeout, False
        self.modules, self.path = set(sys.modules), list(sys.path)
        self.saved = _Saved()

    # -- a batch -------------------------------------------------------------------------
    def begin_batch(self, request: dict) -> None:
        """The batch's environment (the pytest process's, as it differs from the launch one),
        timeout and debug mode."""
        import minipar

        for name in request.get("unset", []):
            os.environ.pop(name, None)
        os.environ.update(request.get("env", {}))
        self.timeout = float(request.get("timeout") or self.timeout)
        self.debug = os.environ.get("MINIPAR_DEBUG") == "1"
        minipar.init(timeout=self.timeout, debug=self.debug)
        self.control.timeout = 3 * self.timeout + CONTROL_SLACK
        self.modules, self.path = set(sys.modules), list(sys.path)

    def snapshot(self) -> None:
        """What every case of the batch starts from (taken once the suite is loaded)."""
        self.saved = _Saved()
        _seed(SEED)

    def end_batch(self, folder: str) -> None:
        """Forget the suite's helper modules, free the groups, restore the tables and env."""
        from minipar.collectives import registry

        for name in set(sys.modules) - self.modules:
            if _inside(getattr(sys.modules[name], "__file__", None), folder):
                del sys.modules[name]
        for collective, table in registry.ALGORITHMS.items():  # before the groups: a case's
            table.clear()  # algorithm may hold its suite, and the suite its groups
            table.update(self.algorithms[collective])
        self.groups.free_unused(self.control)
        sys.path[:] = self.path
        _restore_environ(self.launch_environ)

    # -- a case ----------------------------------------------------------------------------
    def after_case(self, ok: bool) -> dict:
        """Reset this rank, then compare notes with the others: {"error", "rebuild"}."""
        problems = self._reset()
        world = self.world
        mine = {"ok": ok, "seq": world._seq if world else None, "problems": problems,
                "shm": _shm_round(world)}  # fmt: skip
        notes = self.control.allgather_object(mine, "the harness comparing notes after a case")
        return self._verdict(notes)

    def _reset(self) -> list[str]:
        import minipar
        from minipar import ledger

        ledger._active.clear()
        self.saved.restore()
        self.groups.after_case()
        problems = []
        if not minipar.is_initialized():
            try:
                minipar.init(backend=self.backend)
            except Exception as error:  # noqa: BLE001
                self.world = None
                return [f"minipar.init() failed after the case finalized minipar: {error}"]
        self.world = minipar.init(timeout=self.timeout, debug=self.debug)
        problems += _unusable(self.world, self.control)
        return problems

    def _verdict(self, notes: list[dict]) -> dict:
        errors, rebuild = [], False
        for rank, note in enumerate(notes):
            for problem in note["problems"]:
                errors.append(f"rank {rank}: {problem}")
                rebuild = True
        if len({note["shm"] for note in notes}) > 1:
            rounds = {r: n["shm"] for r, n in enumerate(notes)}
            errors.append(f"the default group's shared-memory rounds differ: {rounds}")
            rebuild = True
        seqs = [note["seq"] for note in notes]
        if self.world is not None and None not in seqs and len(set(seqs)) > 1:
            self.world._seq = max(seqs)  # realign: tags match again from the next call on
            if all(note["ok"] for note in notes):
                counts = ", ".join(f"rank {r}: {s}" for r, s in enumerate(seqs))
                errors.append(
                    "after this case the ranks disagree on how many collective calls the "
                    f"default group made ({counts}): some rank made a call the others did not"
                )
        return {"error": "\n".join(errors) or None, "rebuild": rebuild}


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
        if self.torch is not None:
            torch = sys.modules["torch"]
            dtype, grad = self.torch
            torch.set_default_dtype(dtype)
            torch.set_grad_enabled(grad)


def _seed(seed: int) -> None:
    """The same generators on every rank, whatever the case before drew or seeded."""
    random.seed(seed)
    for name in ("numpy", "torch"):
        module = sys.modules.get(name)
        if module is not None:
            (module.random.seed if name == "numpy" else module.manual_seed)(seed)


def _restore_environ(saved: dict) -> None:
    for name in [n for n in os.environ if n not in saved]:
        del os.environ[name]
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _inside(path, folder: str) -> bool:
    return bool(path) and os.path.abspath(path).startswith(os.path.abspath(folder) + os.sep)


def _shm_round(world):
    node = getattr(world, "_shm_node", None)
    return node.round if node else None


def _unusable(world, control) -> list[str]:
    """Why the default group (or the harness's own) cannot serve another case, if it cannot."""
    from minipar.collectives import work

    problems = []
    for group in (world, control):
        if getattr(group, "_failure", None) is not None:
            problems.append(f"group {group.name} failed: {group._failure}")
        if getattr(group, "_control_spent", None) is not None:
            problems.append(f"group {group.name}'s control calls are spent: {group._control_spent}")
    deadline = time.monotonic() + world.timeout
    while not work.idle() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not work.idle():
        problems.append(f"async collectives still running {world.timeout:g} s after the case")
    return problems
