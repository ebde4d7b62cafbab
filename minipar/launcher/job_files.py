"""What an MPICH job leaves in /dev/shm and /tmp when it does not end cleanly, named exactly.

    files = JobFiles(proc.pid, began)    # mpiexec's pid; time.time() just before it started
    ...                                  # the job runs, and ends however it ends
    files.remove()                       # what it left: its segments, hydra's topology file

MPICH's ranks on a node share one segment, /dev/shm/mpich_shm_<ID>_<NODE> (mpich_vci_<ID>_<NODE>
beside it with several VCIs): the first rank makes it in MPI_Init and the last unlinks it in
MPI_Finalize, so a job whose ranks were stopped, killed or aborted, or exited without
finalizing, leaves it (each one the size of the ranks' queues: ~1.6 MB for 2 ranks). ID is the
FNV-1a hash of hydra's name for the job, kvs_<PID>_0_<R>_<HOST>: PID mpiexec's own, R the C
library's first rand() after srand(the second mpiexec started in), HOST the launcher's
hostname. The launcher knows all three, so it computes its job's IDs (one for each second the
job could have started in) and removes exactly those segments: never another job's, never
another user's.

Hydra's proxy writes /tmp/hydra_hwloc_xmlfile_XXXXXX (whatever TMPDIR says), holds it open
while it runs and removes it when it ends, unless it is killed (or the job aborted). Its name is
random; a file of that kind written since the job began, owned by this user and held open by no
process is a dead job's, and is removed (`dead_topology_files`).

Open MPI's launcher and daemons keep session folders (ompi.PID, prted.PID), which a killed one
leaves: minipar's launcher gives the job a folder of its own for them (mpiexec.session_folder),
removed with the rest.

`stale_segments()` is the sweep's (cluster/leftovers.py): MPICH segments of this user that no
process maps or holds open any more, a minute old or more: what a SIGKILLed launcher's job
left, found by the next `minipar doctor` or `minipar run --nodes`.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import socket
import time

SHM_DIR = "/dev/shm"
SEGMENT = re.compile(r"^mpich_(?:shm|vci)_([0-9a-f]+)_\d+$")
HYDRA_TOPOLOGY = "/tmp/hydra_hwloc_xmlfile_*"  # hydra writes it there whatever TMPDIR says
SETTLED = 60.0  # seconds: an unmapped segment younger than this may belong to a job starting


def fnv1a(text: str) -> int:
    """32-bit FNV-1a, MPICH's HASH_FNV (uthash) of the job's name."""
    h = 2166136261
    for byte in text.encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h


def _libc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "srand") and hasattr(libc, "rand") else None
    except OSError:
        return None


def first_rand(seed: int, libc=None) -> int:
    """The C library's rand() right after srand(seed): what hydra drew for the job's name
    (this process's C library is the one mpiexec runs on)."""
    libc = libc or _libc()
    libc.srand(ctypes.c_uint(seed & 0xFFFFFFFF))
    return libc.rand()


def job_ids(pid: int, began: float, ended: float, host: str | None = None) -> set[int]:
    """The IDs MPICH gives the segments of the job whose mpiexec has pid `pid`, for every
    second it could have started in (began - 1 to ended + 1); empty without a C library."""
    libc = _libc()
    if libc is None:
        return set()
    host = host or socket.gethostname()
    seconds = range(int(began) - 1, int(ended) + 2)
    return {fnv1a(f"kvs_{pid}_0_{first_rand(t, libc)}_{host}") for t in seconds}


def _mine(path: str) -> bool:
    try:
        return os.lstat(path).st_uid == os.getuid()
    except OSError:
        return False


def segments_of(ids: set[int]) -> list[str]:
    """This user's MPICH segments in /dev/shm whose ID is one of `ids`."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    found = []
    for name in names:
        match = SEGMENT.match(name)
        if match and int(match.group(1), 16) in ids and _mine(os.path.join(SHM_DIR, name)):
            found.append(os.path.join(SHM_DIR, name))
    return sorted(found)


def in_use(kind: str, maps: bool = False) -> set[tuple[int, int]]:
    """(device, inode) of every file whose path holds `kind` that a process this user may look
    at holds open (and, with `maps`, maps into memory): /proc/PID/fd and /proc/PID/maps."""
    used = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fds = f"/proc/{pid}/fd"
        try:
            for fd in os.listdir(fds):
                try:
                    if kind in os.readlink(os.path.join(fds, fd)):
                        info = os.stat(os.path.join(fds, fd))
                        used.add((info.st_dev, info.st_ino))
                except OSError:
                    pass
        except OSError:
            continue
        if maps:
            used |= _mapped(pid, kind)
    return used


def _mapped(pid: str, kind: str) -> set[tuple[int, int]]:
    """(device, inode) of the files whose path holds `kind` that process pid maps."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if kind not in line:
                    continue
                dev, inode = line.split()[3:5]
                major, minor = (int(x, 16) for x in dev.split(":"))
                found.add((os.makedev(major, minor), int(inode)))
    except (OSError, ValueError):
        pass
    return found


def _key(path: str):
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def dead_topology_files(since: float) -> list[str]:
    """Hydra's topology files written at or after `since` (time.time()), this user's, that no
    process holds open: their proxy has gone without removing them."""
    candidates = [p for p in glob.glob(HYDRA_TOPOLOGY) if _mine(p) and _written_since(p, since)]
    if not candidates or not os.path.isdir("/proc"):
        return []
    used = in_use("hydra_hwloc_xmlfile_")
    return sorted(p for p in candidates if _key(p) not in used)


def _written_since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since - 1.0  # 1 s: the clock's grain
    except OSError:
        return False


def stale_segments(settled: float = SETTLED) -> list[str]:
    """This user's MPICH segments that no process maps or holds open, unchanged for `settled`
    seconds: a dead job's (a live job's ranks map theirs from MPI_Init to MPI_Finalize)."""
    try:
        names = [n for n in os.listdir(SHM_DIR) if SEGMENT.match(n)]
    except OSError:
        return []
    now = time.time()
    old = []
    for name in names:
        path = os.path.join(SHM_DIR, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if info.st_uid == os.getuid() and now - max(info.st_mtime, info.st_ctime) >= settled:
            old.append(path)
    if not old:
        return []
    used = in_use("mpich_", maps=True)
    return sorted(p for p in old if _key(p) not in used)


def remove(paths: list[str]) -> list[str]:
    """Remove each path; the ones removed (one gone already is not)."""
    removed = []
    for path in paths:
        try:
            os.remove(path)
            removed.append(path)
        except OSError:
            pass
    return removed


class JobFiles:
    """The files one job (mpiexec with pid `pid`, started at `began`) may leave behind.
    segments=False: its ranks had a /dev/shm of their own (emulated nodes, enter.py)."""

    def __init__(self, pid: int, began: float, segments: bool = True, host: str | None = None,
                 session: str | None = None):  # fmt: skip
        self.pid, self.began, self.segments, self.host = pid, began, segments, host
        self.session = session  # the job's folder for Open MPI's session folders, if any

    def left(self) -> list[str]:
        """What the job left that is still there: its segments, dead topology files."""
        found = []
        if self.segments:
            found += segments_of(job_ids(self.pid, self.began, time.time(), self.host))
        return found + dead_topology_files(self.began)

    def remove(self) -> list[str]:
        """Remove what the job left (once it has ended: its ranks are gone); the paths."""
        return remove(self.left()) + remove_session(self.session)


def remove_session(folder: str | None) -> list[str]:
    """Remove a job's folder for Open MPI's session folders (mpiexec.session_folder), if any;
    [folder] when it was there."""
    if not folder or not os.path.isdir(folder):
        return []
    shutil.rmtree(folder, ignore_errors=True)
    return [folder]
