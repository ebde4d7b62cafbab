"""One job's emulated cluster, from refusal to removal:

    with emulated(n_nodes=2, link="2gbit") as cluster:   # checked, dead jobs swept, made
        ...run the launcher...                           # removed at the end, however it ends

Before anything is made: what the machine lacks is refused in one message (needs.py), and what
dead jobs left is removed (leftovers.py). While the job runs, SIGTERM and SIGHUP to this
process raise Terminated (a KeyboardInterrupt: the launcher's Ctrl-C path stops the job), so
the nodes are removed on every ending but SIGKILL, which the next job's sweep covers.
"""

from __future__ import annotations

import contextlib

from minipar.launcher.cluster import leftovers, needs
from minipar.launcher.cluster.nodes import EmulatedCluster
from minipar.launcher.stop import Terminated, signals_raise

__all__ = ["Terminated", "emulated"]


@contextlib.contextmanager
def emulated(n_nodes: int, link: str, fill: str = "block"):
    cluster = EmulatedCluster(n_nodes, link, fill=fill)  # the arguments checked first
    needs.check()
    leftovers.sweep()
    with signals_raise() as state:
        cluster.up()
        try:
            yield cluster
        finally:
            state["removing"] = True  # a second signal must not cut the removal short
            cluster.down()
