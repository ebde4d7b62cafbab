"""The shared-memory segments a dead job leaves in /dev/shm, found and removed.

MPICH keeps a job's shared memory (its shared windows: minipar's shm transport, the buffers of
`minipar.empty`) as files in /dev/shm (mpich_shm_*, UCX's ucx_*) until MPI_Win_free or
MPI_Finalize; Open MPI its shared-memory transport's (sm_segment.HOST.UID.JOB.RANK). A rank
killed before either (a job past its timeout, a hung test job, MPI_Abort) leaves its files
behind, megabytes each, until the machine restarts: run after run they pile up.

    held = mapped(tree(proc.pid))     # before the kill: the segments the job's processes map
    remove(held)                      # after it: those still there, that no process maps now
    since(began)                      # a job that ended badly: ours made since, mapped by none
    sweep(before)                     # a test session's end: ours that appeared, mapped by none

stop.stop does the first two for every job it ends, the launcher the third for a job that
aborted (its ranks gone before anyone read their maps), tests/conftest.py the last. A segment
some live process maps is never removed, nor one of another user.
"""

from __future__ import annotations

import os
import time

SHM = "/dev/shm"
PREFIXES = ("mpich_", "ucx_", "sm_segment.")  # MPICH's, UCX's and Open MPI's segments


def tree(pid: int) -> list[int]:
    """pid and every process descended from it (Linux /proc; [pid] elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in _pids():
        parent = _parent(entry)
        if parent is not None:
            children.setdefault(parent, []).append(entry)
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def mapped(pids) -> set[str]:
    """The segments (PREFIXES, in /dev/shm, not yet unlinked) that any of `pids` maps."""
    held = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                text = f.read()
        except OSError:  # gone already, or not ours to read
            continue
        # a rank with torch loaded maps some 1,500 regions, a handful of them in /dev/shm
        for line in (line for line in text.splitlines() if SHM in line):
            fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
            path = fields[5].strip() if len(fields) == 6 else ""
            if _segment(path) and not path.endswith(" (deleted)"):
                held.add(path)
    return held


def remove(paths, pids=(), wait: float = 2.0) -> list[str]:
    """Remove those of `paths` still present once `pids` have exited (up to `wait` s) and no
    live process maps them; the paths removed."""
    deadline = time.monotonic() + wait
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    present = [p for p in paths if os.path.exists(p)]
    if not present:
        return []
    busy = mapped(_pids())
    removed = []
    for path in present:
        if path in busy:
            continue
        try:
            if os.stat(path).st_uid == os.getuid():
                os.remove(path)
                removed.append(path)
        except OSError:
            pass
    return removed


def present() -> set[str]:
    """The segments in /dev/shm now (PREFIXES)."""
    try:
        names = os.listdir(SHM)
    except OSError:
        return set()
    return {os.path.join(SHM, n) for n in names if n.startswith(PREFIXES)}


def sweep(before: set[str]) -> list[str]:
    """Remove this user's segments that are not in `before` (present() when a session began)
    and that no live process maps: what the session's dead jobs left. The paths removed."""
    return remove(present() - set(before))


def since(began: float) -> list[str]:
    """Remove this user's segments made at or after `began` (time.time()) that no live process
    maps: what an aborted job left (its ranks gone before anything read their maps; the
    launcher calls it when a job ended badly). The paths removed."""
    recent = []
    for path in present():
        try:
            if os.stat(path).st_mtime >= began - 1.0:  # 1 s: the clock's grain
                recent.append(path)
        except OSError:
            pass
    return remove(recent)


def _segment(path: str) -> bool:
    return os.path.dirname(path) == SHM and os.path.basename(path).startswith(PREFIXES)


def _pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])  # field 4: ppid
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """Running (a zombie has unmapped everything: not alive here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
