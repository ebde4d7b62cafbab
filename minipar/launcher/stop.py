"""Ending a job that will not end itself: SIGTERM first, then SIGKILL what is left.

    stop(proc, grace=2.0, ranks=())   # proc: the launcher, started in a session of its own

The launcher is asked first (SIGTERM to its process group, and to any rank in a session of its
own: MPICH's hydra starts each rank in one). Given SIGTERM, hydra ends its ranks and removes
the topology file it wrote for them (/tmp/hydra_hwloc_xmlfile_*); SIGKILLed at once it leaves
the file behind, one per killed job. After `grace` seconds, or as soon as the launcher has gone,
SIGKILL reaches whatever is left, so a rank that ignores SIGTERM cannot outlive the job.

A job that ends by MPI_Abort (minipar's way to end a job whose rank failed) leaves hydra's
topology file behind all the same; `remove_hydra_leftovers(since)` removes the ones written
since a job began that no process holds open any more (so no live job's file). What else a job
leaves (MPICH's segments in /dev/shm) is named in job_files.py.

While a job runs, `with signals_raise():` turns SIGTERM and SIGHUP to the launcher into
Terminated (a KeyboardInterrupt), so the launcher's Ctrl-C path stops the job and removes what
it left: without it, SIGTERM ends the launcher alone, and mpiexec (in a session of its own)
and the ranks run on, orphaned, their segments left behind when they end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading

from minipar.launcher import job_files, shm_leftovers

HYDRA_TOPOLOGY = job_files.HYDRA_TOPOLOGY


def stop(proc: subprocess.Popen, grace: float = 2.0, ranks=()) -> None:
    """SIGTERM proc's process group (and `ranks`, pids), wait up to `grace` s, then SIGKILL;
    then remove the shared-memory segments the killed processes mapped (shm_leftovers.py)."""
    job = shm_leftovers.tree(proc.pid) + list(ranks) if proc.poll() is None else list(ranks)
    held = shm_leftovers.mapped(job)
    if proc.poll() is None:
        for pid in (-proc.pid, *ranks):
            signal_pid(pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    for pid in (-proc.pid, *ranks):  # the group may outlive its leader
        signal_pid(pid, signal.SIGKILL)
    proc.wait()
    if held:
        shm_leftovers.remove(held, job)


def die_with_parent() -> bool:
    """Have the kernel SIGKILL this process when its parent dies (Linux's PR_SET_PDEATHSIG: a
    SIGKILLed parent runs no clean-up); False where it cannot be asked (not Linux)."""
    try:
        import ctypes  # here: only the processes that ask load it

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False
    return True


def signal_pid(pid: int, sig: int) -> None:
    """os.kill, where a negative pid names a process group; quiet if it is already gone."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def remove_hydra_leftovers(since: float) -> list[str]:
    """Remove this user's hydra topology files written at or after `since` (time.time()) that
    no process holds open (Linux: /proc); the paths removed."""
    return job_files.remove(job_files.dead_topology_files(since))


class Terminated(KeyboardInterrupt):
    """This process got SIGTERM (or SIGHUP) while its job ran."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


TERMINATING = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_raise(once: bool = False):
    """Inside: SIGTERM and SIGHUP raise Terminated; once state["removing"] is set, one is kept
    and raised at the block's end (a second signal must not cut the clean-up short). `once`:
    the first signal sets it (what the block does on Terminated is all clean-up). A signal
    ignored (nohup's SIGHUP) stays ignored; outside the main thread (a notebook's) only Ctrl-C
    can stop the job."""
    state = {"removing": False, "pending": None}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum, frame):
        if not state["removing"]:
            state["removing"] = once
            raise Terminated(signum)
        state["pending"] = signum  # raised once the clean-up is done

    saved = {}
    for sig in TERMINATING:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            saved[sig] = signal.signal(sig, handler)
    try:
        yield state
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
    if state["pending"] is not None:
        raise Terminated(state["pending"])
