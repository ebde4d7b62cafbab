"""Ending a job that will not end itself: SIGTERM first, then SIGKILL what is left.

    stop(proc, grace=2.0, ranks=())   # proc: the launcher, started in a session of its own

The launcher is asked first (SIGTERM to its process group, and to any rank in a session of its
own: MPICH's hydra starts each rank in one). Given SIGTERM, hydra ends its ranks and removes
the topology file it wrote for them (/tmp/hydra_hwloc_xmlfile_*); SIGKILLed at once it leaves
the file behind, one per killed job. After `grace` seconds, or as soon as the launcher has gone,
SIGKILL reaches whatever is left, so a rank that ignores SIGTERM cannot outlive the job.

A job that ends by MPI_Abort (minipar's way to end a job whose rank failed) leaves hydra's
topology file behind all the same; `remove_hydra_leftovers(since)` removes the ones written
since a job began, once no hydra proxy is left running on the host (so no live job's file).
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess

from minipar.launcher import shm_leftovers

HYDRA_TOPOLOGY = "/tmp/hydra_hwloc_xmlfile_*"  # hydra writes it there whatever TMPDIR says


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


def signal_pid(pid: int, sig: int) -> None:
    """os.kill, where a negative pid names a process group; quiet if it is already gone."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def remove_hydra_leftovers(since: float) -> list[str]:
    """Remove this user's hydra topology files written at or after `since` (time.time()), if
    no hydra proxy runs on this host (Linux: /proc); the paths removed."""
    if not os.path.isdir("/proc") or _hydra_proxy_running():
        return []
    removed = []
    for path in glob.glob(HYDRA_TOPOLOGY):
        try:
            info = os.stat(path)
            if info.st_uid == os.getuid() and info.st_mtime >= since - 1.0:  # 1 s: clock grain
                os.remove(path)
                removed.append(path)
        except OSError:
            pass
    return removed


def _hydra_proxy_running() -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "hydra_pmi_proxy":
                    return True
        except OSError:
            pass
    return False
