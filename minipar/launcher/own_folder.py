"""A process's own folder in the temporary directory, named after the process that made it.

    scratch = own_folder.make("grade")     # $TMPDIR/minipar-grade-4242-k3j9x1aq
    ...
    shutil.rmtree(scratch)                 # every ending that runs Python removes its own

A SIGKILL runs nothing, so a killed grader, pytest session or launcher leaves its folders
behind. The owner's pid in the name is what lets the next sweep (cluster/leftovers.py: every
`minipar grade`, `minipar run --nodes` and `minipar doctor` runs it) find them: a folder whose
owner is gone (no such process, or one that started after the folder was made: the pid was
reused) is removed; a live owner's never is, whoever it belongs to.
"""

from __future__ import annotations

import os
import re
import tempfile

# minipar-KIND-PID-... (grade, test, pool, zygote, inductor, batch, io) and a node's
# minipar-PID-JOB-...
OWNED = re.compile(r"^minipar-(?:([a-z]+)-)?(\d+)-")


def prefix(kind: str) -> str:
    """minipar-KIND-PID-: the start of this process's folders of that kind."""
    return f"minipar-{kind}-{os.getpid()}-"


def make(kind: str) -> str:
    """A new folder minipar-KIND-PID-XXXXXXXX in the temporary directory (mode 0700)."""
    return tempfile.mkdtemp(prefix=prefix(kind))


def owner(name: str, kinds=None) -> int | None:
    """The pid in a folder's name (its basename), or None for a name not made this way (or, with
    `kinds`, not of one of those kinds)."""
    found = OWNED.match(name)
    if not found or (kinds is not None and found.group(1) not in kinds):
        return None
    return int(found.group(2))
