"""What a dead job left: its namespaces (and what runs in them) and its folder, found and removed.

A job removes its nodes however it ends, except when `minipar run` itself is SIGKILLed: then
nothing runs its clean-up. Every name carries the pid of the process that made it (nodes.py),
so the next `minipar run --nodes`, `minipar grade` and `minipar doctor` find the ones whose
owner is gone (no such process, or a process that started after the namespace was made: the
pid was reused) and remove them. A live job's namespaces are never touched, whoever owns them.

The same sweep removes what dead MPICH jobs of this user left in the machine's /dev/shm and
/tmp (launcher/job_files.py): segments no process maps any more, hydra's topology files no
process holds open; a launcher removes its own job's at every other ending. And the folders a
killed process left in the temporary directory, each named after its owner (own_folder.py):
a node's files, a job's pipes, a grader's copy of the submission, a test job's results, the
warm pool's and the fork server's folders.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

from minipar.launcher import job_files, own_folder
from minipar.launcher.cluster.nodes import NAME, NETNS_DIR, PREFIX, namespaces, remove_namespace


def started_at(pid: int) -> float | None:
    """When process pid started (seconds since the epoch), or None when there is none (or only
    its zombie: an orphan's, where PID 1 does not reap, stays until the machine's end)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):  # field 3: the state; a zombie has exited
            return None
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, IndexError, StopIteration, ValueError):
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks


def owner_alive(pid: int, made: float) -> bool:
    began = started_at(pid)
    return began is not None and began <= made + 1.0  # 1 s: the boot time's grain


def _made(name: str) -> float:
    try:
        return os.stat(os.path.join(NETNS_DIR, name)).st_mtime
    except OSError:
        return 0.0


def stale() -> list[str]:
    """The minipar namespaces whose owner is gone."""
    dead = []
    for name in namespaces():
        owner = int(NAME.match(name).group(1))
        if not owner_alive(owner, _made(name)):
            dead.append(name)
    return dead


def stale_folders(kinds=None) -> list[str]:
    """The folders in the temporary directory whose owner is gone (own_folder.py): a dead
    job's nodes' files and ranks' pipes, a killed grader's or test session's folders (only
    those of `kinds`, when given)."""
    found = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}*")):
        owner = own_folder.owner(os.path.basename(path), kinds)
        try:
            if owner is not None and not owner_alive(owner, os.stat(path).st_mtime):
                found.append(path)
        except OSError:
            pass
    return found


def sweep() -> list[str]:
    """Remove every dead job's namespaces (processes inside killed first), every folder whose
    owner is gone, and this user's dead MPICH segments and topology files; the names removed."""
    removed = []
    for name in stale() if os.geteuid() == 0 else []:  # a rootless job's go with its holder
        remove_namespace(name)
        removed.append(name)
    removed += sweep_folders()
    removed += job_files.remove(job_files.stale_segments())
    removed += job_files.remove(job_files.dead_topology_files(0.0))
    return removed


# a grader's folders (a test session's; a batch's copy of the uploads)
GRADER = ("grade", "test", "pool", "zygote", "inductor", "batch")


def sweep_grader() -> list[str]:
    """What a killed `minipar grade` or pytest session left: its folders (GRADER) and the
    segments of its dead jobs. A job's namespaces, pipes and hydra's files are left to the
    next `minipar run --nodes` (or doctor): a test may be about to look at them."""
    return sweep_folders(GRADER) + job_files.remove(job_files.stale_segments())


def sweep_folders(kinds=None) -> list[str]:
    """Remove the folders whose owner is gone (of `kinds`, when given); the paths removed."""
    removed = []
    for path in stale_folders(kinds):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):  # another user's stays (its owner's next job removes it)
            removed.append(path)
    return removed
