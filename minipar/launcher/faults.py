"""Faults on demand, for the restart tests and lesson 12: a node killed, a cable pulled, a rank
killed, at a training step or after some seconds, the target chosen or drawn with a seed.

    --fault kill-node:1@step=5     every process of emulated node 1 SIGKILLed once step 5 is done
    --fault pull-link:2@30s        node 2's cable down (ip link set eth0 down) 30 s into the job
    --fault kill-rank:3@step=4     rank 3 SIGKILLed (no emulated nodes needed)
    --fault kill-node:random@step=9 --fault-seed 1     the node drawn with the seed

A step is the training's global step (the run's progress file: cli/train_checkpoint.py), so a
fault at step 9 fires in whichever attempt first gets there; seconds count from the attempt's
start. Each fault fires once. A killed node's processes die as a host's would (SIGKILL, no
goodbye), and the launcher ends the job at once, naming it; a pulled cable leaves the ranks
waiting until their timeout (MINIPAR_TIMEOUT) ends the job: what a real cluster sees.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import signal
import subprocess

KINDS = ("kill-node", "pull-link", "kill-rank")
SPEC = re.compile(
    r"^(?P<kind>[a-z-]+):(?P<target>\d+|random)@(?:step=(?P<step>\d+)|(?P<sec>[\d.]+)s)$"
)


@dataclasses.dataclass
class Fault:
    kind: str
    target: int | None  # None: drawn with the seed when it fires
    step: int | None = None
    seconds: float | None = None
    fired: bool = False

    def __str__(self) -> str:
        target = "random" if self.target is None else self.target
        when = f"step={self.step}" if self.step is not None else f"{self.seconds:g}s"
        return f"{self.kind}:{target}@{when}"

    def due(self, step: int | None, elapsed: float) -> bool:
        if self.fired:
            return False
        if self.step is not None:
            return step is not None and step >= self.step
        return elapsed >= self.seconds


def parse(text: str) -> Fault:
    """A --fault spec, or ValueError naming it and the forms accepted."""
    m = SPEC.match(text.strip())
    if not m or m["kind"] not in KINDS:
        raise ValueError(
            f"--fault {text!r}: expected KIND:TARGET@step=N or KIND:TARGET@SECONDSs, KIND one "
            f"of {', '.join(KINDS)}, TARGET a number or random (e.g. kill-node:1@step=5)"
        )
    target = None if m["target"] == "random" else int(m["target"])
    step = int(m["step"]) if m["step"] else None
    return Fault(m["kind"], target, step, float(m["sec"]) if m["sec"] else None)


def check(faults: list[Fault], nodes: int | None, n: int) -> None:
    """ValueError for a fault that cannot fire on this job (before anything starts)."""
    for fault in faults:
        if fault.kind in ("kill-node", "pull-link"):
            if nodes is None:
                raise ValueError(f"--fault {fault}: a node fault needs emulated nodes (--nodes N)")
            if fault.target is not None and not 0 <= fault.target < nodes:
                raise ValueError(
                    f"--fault {fault}: node {fault.target} is not one of 0..{nodes - 1}"
                )
        elif fault.target is not None and not 0 <= fault.target < n:
            raise ValueError(f"--fault {fault}: rank {fault.target} is not one of 0..{n - 1}")


def pick(fault: Fault, choices: list[int], rng: random.Random) -> int:
    """The fault's target among `choices` (live node indices, or ranks): its own, or drawn."""
    if fault.target is not None and fault.target in choices:
        return fault.target
    return rng.choice(choices)


def kill_node(namespace: str) -> list[int]:
    """SIGKILL every process inside an emulated node's namespace; the pids killed."""
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    pids = [int(p) for p in done.stdout.split() if p.isdigit() and int(p) != os.getpid()]
    for pid in pids:
        kill_pid(pid)
    return pids


def pull_link(namespace: str) -> None:
    """The node's cable pulled: its eth0 down, inside its namespace."""
    subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "down"], check=True,
                   capture_output=True, timeout=30)  # fmt: skip


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
