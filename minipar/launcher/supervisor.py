"""`minipar run --max-restarts N`: a job that loses a rank, a node or a link starts again.

    Supervisor(n=6, nodes=3, max_restarts=5, faults=[...], run=attempt).run()

Roughly:
    alive = every node
    loop:
        emulated nodes for `alive` (n / nodes ranks each), the job started on them
        (MINIPAR_REFIT=1: the training refits dp to the ranks it finds; MINIPAR_PROGRESS: it
        says which step it has done, and each rank's pid)
        a watcher fires the faults that are due (launcher/faults.py), then, if the job has
        not ended `grace` seconds later, SIGKILLs its ranks (what is left of it)
        exit 0: done.  exit 2 (the job refused its input: a layout it cannot refit): stop.
        else: the dead node (a killed node or a pulled cable) replaced by a spare while there
        are spares (--spare-nodes), else dropped; restart, at most N times

The training resumes from the newest whole checkpoint by itself (cli/train_checkpoint.py); the
supervisor logs each restart: what died and when, the step it had reached, the checkpoint the
next attempt resumed from, the steps lost (done twice) and the seconds lost (from the first
time the resumed step was done to the second). A node's number is the attempt's: after node1
of node0..node2 is dropped, the old node2 is node1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import tempfile
import threading
import time

from minipar.launcher import faults as fault_kit
from minipar.launcher.cluster.job import emulated

PROGRESS_ENV = "MINIPAR_PROGRESS"
REFIT_ENV = "MINIPAR_REFIT"
GRACE = 60.0  # seconds a job may take to end by itself after a fault before its ranks are killed


@dataclasses.dataclass
class Attempt:
    index: int
    nodes: int | None
    ranks: int
    began: float
    ended: float = 0.0
    returncode: int | None = None
    fault: str | None = None  # what was injected, as said
    fault_at: float | None = None  # seconds into the attempt
    dead_node: int | None = None
    progress: list = dataclasses.field(default_factory=list)  # [(step done, unix time)]


class Supervisor:
    def __init__(self, n, nodes, link, fill, max_restarts, faults, seed, run, say,
                 grace=GRACE, spares=0):  # fmt: skip
        self.n, self.nodes, self.link, self.fill = n, nodes, link, fill
        self.per_node = n // nodes if nodes else n
        self.max_restarts, self.faults, self.run_attempt = max_restarts, faults, run
        self.rng, self.say, self.grace = random.Random(seed), say, grace
        self.spares = spares  # nodes that replace dead ones, while they last
        self.attempts: list[Attempt] = []
        self.began = time.time()

    def run(self) -> int:
        alive = self.nodes
        folder = tempfile.mkdtemp(prefix="minipar-supervisor-")
        saved = {k: os.environ.get(k) for k in (PROGRESS_ENV, REFIT_ENV)}
        try:
            while True:
                attempt = self._attempt(len(self.attempts), alive, folder)
                self.attempts.append(attempt)
                rc = attempt.returncode
                if rc == 0 or rc == 2 or len(self.attempts) > self.max_restarts:
                    if rc == 2 and len(self.attempts) > 1:
                        self.say("the job refused to start (exit 2): not restarted")
                    elif rc not in (0, 2):
                        self.say(f"giving up after {self.max_restarts} restart(s)")
                    return rc
                if attempt.dead_node is not None and alive and self.spares:
                    self.spares -= 1  # a spare node takes the dead one's place: same layout
                    self.say(f"a spare node replaces node{attempt.dead_node} "
                             f"({self.spares} spare(s) left)")  # fmt: skip
                elif attempt.dead_node is not None and alive:
                    alive -= 1
                    if alive == 0:
                        self.say("no node left: not restarted")
                        return rc
                where = f"on {alive} node(s), " if alive else ""
                ranks = self.per_node * alive if alive else self.n
                said = f"{self._what_died(attempt)}; starting again {where}{ranks} ranks"
                self.say(f"restart {len(self.attempts)} of {self.max_restarts}: {said}")
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            shutil.rmtree(folder, ignore_errors=True)

    def _what_died(self, a: Attempt) -> str:
        step = a.progress[-1][0] if a.progress else 0
        what = a.fault or f"the job exited with status {a.returncode}"
        when = f" at {a.fault_at:.1f} s" if a.fault_at is not None else ""
        return f"{what}{when} (step {step} done, exit {a.returncode})"

    def _attempt(self, index: int, alive: int | None, folder: str) -> Attempt:
        ranks = self.per_node * alive if alive else self.n
        progress = os.path.join(folder, f"progress-{index}")
        os.environ[PROGRESS_ENV], os.environ[REFIT_ENV] = progress, "1"
        attempt = Attempt(index, alive, ranks, time.time())
        if alive is None:
            attempt.returncode = self._watched(attempt, None, progress)
        else:
            with emulated(alive, self.link, self.fill) as cluster:
                attempt.returncode = self._watched(attempt, cluster, progress)
        attempt.ended = time.time()
        attempt.progress = read_progress(progress)
        return attempt

    def _watched(self, attempt: Attempt, cluster, progress: str) -> int:
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(attempt, cluster, progress, stop),
                                   daemon=True)  # fmt: skip
        watcher.start()
        try:
            return self.run_attempt(attempt.ranks, cluster)
        finally:
            stop.set()
            watcher.join()

    def _watch(self, attempt, cluster, progress, stop) -> None:
        """Fire the next fault (in the order given) once it is due, at most one per attempt,
        then end the job if it lingers."""
        fired_at = None
        while not stop.wait(0.05):
            if fired_at is not None:
                if time.monotonic() - fired_at > self.grace:
                    for pid in rank_pids(progress, attempt.ranks):
                        fault_kit.kill_pid(pid)  # what is left of the job
                    fired_at = float("inf")
                continue
            done = read_progress(progress)
            step = done[-1][0] if done else None
            elapsed = time.time() - attempt.began
            fault = next((f for f in self.faults if not f.fired), None)  # in the order given
            if fault and fault.due(step, elapsed) and self._fire(fault, attempt, cluster, progress):
                fired_at = time.monotonic()

    def _fire(self, fault, attempt, cluster, progress) -> bool:
        if fault.kind == "kill-rank":
            pids = rank_pids(progress, attempt.ranks)
            if len(pids) < attempt.ranks:
                return False  # not every rank has started: wait
            rank = fault_kit.pick(fault, list(range(attempt.ranks)), self.rng)
            fault_kit.kill_pid(pids[rank])
            said = f"rank {rank} killed"
        else:
            node = fault_kit.pick(fault, list(range(cluster.n_nodes)), self.rng)
            if fault.kind == "kill-node":
                fault_kit.kill_node(cluster.namespace(node))
                said = f"node{node} killed"
            else:
                fault_kit.pull_link(cluster.namespace(node))
                said = f"node{node}'s cable pulled"
            attempt.dead_node = node
        fault.fired = True
        attempt.fault, attempt.fault_at = f"{said} (--fault {fault})", time.time() - attempt.began
        self.say(f"fault: {said} at {attempt.fault_at:.1f} s")
        return True

    # -- the account ------------------------------------------------------------------------
    def restarts(self) -> list[dict]:
        """One record per restart: what died, when, the step reached, the checkpoint resumed
        from, the steps lost (done twice) and the seconds lost: from the last step done before
        the failure to the first one done after, less one step, plus the steps done twice (each
        a median step)."""
        out, step_s, known = [], median_step(self.attempts), 0
        for before, after in zip(self.attempts, self.attempts[1:]):
            # an attempt cut before its first step reached the step it would have resumed at
            reached, last = before.progress[-1] if before.progress else (known, before.began)
            known = max(known, reached)
            record = {
                "died": before.fault or f"exit {before.returncode}",
                "at_s": round(before.ended - self.began, 2),
                "step_reached": reached,
                "nodes_after": after.nodes,
                "ranks_after": after.ranks,
            }
            if after.progress:
                resumed = after.progress[0][0] - 1
                known = resumed
                redone = reached - resumed
                lost = after.progress[0][1] - last - step_s + redone * step_s
                record.update(resumed_from=resumed, steps_lost=redone, seconds_lost=round(lost, 2))
            out.append(record)
        return out

    def report(self) -> dict:
        attempts = [dataclasses.asdict(a) for a in self.attempts]
        last = self.attempts[-1] if self.attempts else None
        return {"restarts": self.restarts(), "attempts": attempts,
                "wall_s": round((last.ended if last else time.time()) - self.began, 2),
                "returncode": last.returncode if last else None}  # fmt: skip

    def summary_lines(self) -> list[str]:
        lines = []
        for i, r in enumerate(self.restarts(), 1):
            lost = (f"resumed from the checkpoint of step {r['resumed_from']}: {r['steps_lost']} "
                    f"step(s) and {r['seconds_lost']:.1f} s lost") if "resumed_from" in r else (
                    "no step done after it")  # fmt: skip
            lines.append(f"restart {i}: {r['died']} at {r['at_s']:.1f} s, step {r['step_reached']}"
                         f" done; {lost}")  # fmt: skip
        return lines

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.report(), f, indent=1)


def median_step(attempts) -> float:
    """The median seconds between two steps done in a row, over every attempt (0: none)."""
    gaps = sorted(
        t1 - t0
        for a in attempts
        for (s0, t0), (s1, t1) in zip(a.progress, a.progress[1:])
        if s1 == s0 + 1
    )
    return gaps[len(gaps) // 2] if gaps else 0.0


def read_progress(path: str) -> list[tuple[int, float]]:
    """[(step done, unix time)] from a training's progress file (empty while there is none)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            out.append((int(parts[0]), float(parts[1])))
    return out


def rank_pids(progress: str, ranks: int) -> list[int]:
    """The pids the ranks wrote beside the progress file (those that have started)."""
    pids = []
    for rank in range(ranks):
        try:
            with open(f"{progress}.rank{rank}") as f:
                pids.append(int(f.read().strip()))
        except (OSError, ValueError):
            break
    return pids
