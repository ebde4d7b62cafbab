"""What emulated nodes need, checked before anything is made: one refusal that names it all.

Network namespaces, veths and tc need root (CAP_NET_ADMIN and CAP_SYS_ADMIN); the commands are
iproute2's `ip` and `tc`, util-linux's `nsenter` and `unshare`, and `hostname`. Where one is
missing the job is refused before any namespace exists, with how to run without emulation.
"""

from __future__ import annotations

import os
import shutil

from minipar.launcher.cluster.nodes import EmulationError

TOOLS = {
    "ip": "iproute2 (apt-get install iproute2)",
    "tc": "iproute2 (apt-get install iproute2)",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "hostname": "hostname (apt-get install hostname)",
    "mount": "util-linux",
}
WITHOUT = "run on one node instead: minipar run -n 4 script.py (no --nodes)"


def missing() -> list[str]:
    """What this machine lacks for emulated nodes, one line each (empty: nothing)."""
    lacks = []
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        lacks.append("root: network namespaces and tc need it (sudo, or a root container)")
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            lacks.append(f"the `{tool}` command, from {package}")
    if not os.path.isdir("/proc/self/ns") or not os.path.exists("/proc/self/ns/net"):
        lacks.append("network namespaces: this kernel (or container) has none")
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
