"""What emulated nodes need, checked before anything is made: one refusal that names it all.

Network namespaces, veths and tc need root (CAP_NET_ADMIN and CAP_SYS_ADMIN), or, without it,
a user namespace in which this user is root (rootless.py; where the kernel allows one: tried,
not assumed); the commands are iproute2's `ip` and `tc`, util-linux's `nsenter` and
`unshare`, and `hostname`. Where one is missing the job is refused before any namespace
exists, with how to run without emulation: on one node, or on a simulated cluster.

iproute2 installs `ip` and `tc` in /usr/sbin (or /sbin), which Debian leaves off a user's PATH
(its /etc/profile: /usr/local/bin:/usr/bin:/bin); without root a user still runs them, inside a
user namespace of its own (rootless.py). So the system folders are added to the end of this
process's PATH before anything is looked for, and every command of the job inherits them.
"""

from __future__ import annotations

import os
import shutil

from minipar.launcher.cluster import rootless
from minipar.launcher.cluster.nodes import EmulationError

TOOLS = {
    "ip": "iproute2 (apt-get install iproute2)",
    "tc": "iproute2 (apt-get install iproute2)",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "hostname": "hostname (apt-get install hostname)",
    "mount": "util-linux",
}
SYSTEM_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")
WITHOUT = (
    "Run on one node instead: minipar run -n 4 script.py (no --nodes), or a simulated cluster: "
    "minipar simulate all_reduce --ranks 16 --per-node 4 --cluster h100"
)


def system_dirs_on_path() -> None:
    """Append each of SYSTEM_DIRS that this process's PATH lacks, in that order (a student's
    PATH on Debian has none of them; root's has them all, and nothing changes)."""
    path = os.environ.get("PATH", "")
    have = path.split(os.pathsep) if path else []
    add = [d for d in SYSTEM_DIRS if d not in have]
    if add:
        os.environ["PATH"] = os.pathsep.join(have + add)


def missing() -> list[str]:
    """What this machine lacks for emulated nodes, one line each (empty: nothing); the system
    folders added to PATH first (system_dirs_on_path)."""
    system_dirs_on_path()
    lacks = []
    if not hasattr(os, "geteuid"):
        return ["Linux: network namespaces are Linux's"]
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            lacks.append(f"the `{tool}` command, from {package}")
    if not os.path.isdir("/proc/self/ns") or not os.path.exists("/proc/self/ns/net"):
        lacks.append("network namespaces: this kernel (or container) has none")
    if not lacks and rootless.wanted():  # the probe needs the commands: tried only with them
        why = rootless.why_not()
        if why:
            lacks.append(f"root, or user namespaces without it: {why}")
    elif rootless.wanted():
        lacks.append("root, or user namespaces without it (not tried: a command is missing)")
    return lacks


def check(what: str = "--nodes") -> None:
    """Raise EmulationError naming everything missing; nothing has been made yet."""
    lacks = missing()
    if lacks:
        raise EmulationError(
            f"{what} emulates nodes with network namespaces, and this machine lacks: "
            + "; ".join(lacks)
            + f". {WITHOUT}"
        )
