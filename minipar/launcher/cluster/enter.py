"""The stand-in for ssh: run a command on an emulated node instead of logging in to a host.

    ENTER [-x] HOST word ...            what a launcher runs to start its proxy on HOST
    ssh node1                           in a standing cluster's shell: a shell on node1

MPICH's hydra (`-launcher ssh -launcher-exec ENTER`) and Open MPI's prterun (`--prtemca
plm_ssh_agent ENTER`) start the proxy of every other host through ssh. On emulated nodes
there is no sshd: this stand-in looks HOST up in the job's table (MINIPAR_EMULATED_NODES:
address=namespace=hostname, ...), enters that node's network namespace (nsenter), gives the
process a UTS namespace of its own with the node's hostname and a mount namespace in which the
job's hosts file (MINIPAR_EMULATED_HOSTS: node0 -> 10.200.0.1, ...) is /etc/hosts, so node names
resolve as on a cluster (torch.distributed's rendezvous at rank 0's host needs it), mounts a
/dev/shm of the node's own (a tmpfs, as a real node has its own memory), and runs the words as
ssh would: joined by spaces and read by the shell (Open MPI's are a little script). Whatever
the proxy starts, the ranks included, inherits the node's network, hostname, hosts file and
/dev/shm; the machine's own /etc/hosts and /dev/shm are never touched.

Why /dev/shm of its own: MPICH names a job's segment on a node after the launcher's pid, the
second it started and its host's name (/dev/shm/mpich_shm_<hash>_<node>). Inside a user
namespace (rootless.py) pids start again at 1 and every job's node0 is called node0, so two
users' jobs started in the same second computed the same name in the one machine-wide /dev/shm:
the second one opened the first one's segment (MPI_Init: "Out of memory", or both jobs hung).
A tmpfs per node per job cannot collide with anyone's, and it goes with the node's last process
however the job ends: nothing is left in the machine's /dev/shm.

The launcher itself runs on node0 the same way, with its argv kept exact (`argv_on_node`).
"""

from __future__ import annotations

import os
import shlex
import sys

TABLE_ENV = "MINIPAR_EMULATED_NODES"
HOSTS_ENV = "MINIPAR_EMULATED_HOSTS"  # the job's hosts file, bound over /etc/hosts on a node
NETNS_DIR = "/run/netns"
SSH_FLAGS = ("-x", "-q", "-T", "-n", "-t")  # ssh options without a value that launchers pass
SSH_VALUED = ("-o", "-p", "-l")  # and with one (-o StrictHostKeyChecking=no), ignored alike


def lookup(host: str, table: str) -> tuple[str, str]:
    """(namespace, hostname) of HOST (an address or a hostname) in the job's table."""
    for entry in table.split(","):
        address, namespace, hostname = entry.split("=")
        if host in (address, hostname):
            return namespace, hostname
    known = ", ".join(e.split("=")[0] for e in table.split(",") if e)
    raise ValueError(f"host {host!r} is not an emulated node of this job (its nodes: {known})")


def _enter(namespace: str) -> list[str]:
    return ["nsenter", f"--net={NETNS_DIR}/{namespace}", "--", "unshare", "--uts", "--mount", "--"]


SHM_MOUNT = "mount -t tmpfs -o mode=1777,nosuid,nodev minipar-shm /dev/shm"


def _become(hostname: str, hosts: str) -> str:
    """The shell's first words on a node: a /dev/shm of its own, its hosts file (when the job
    has one), its hostname."""
    name = f"{SHM_MOUNT} && hostname {shlex.quote(hostname)}"
    return f"mount --bind {shlex.quote(hosts)} /etc/hosts && {name}" if hosts else name


def argv_on_node(namespace: str, hostname: str, hosts: str, argv: list[str]) -> list[str]:
    """A command line that runs argv, exactly as given, on the node."""
    return [*_enter(namespace), "sh", "-c", f'{_become(hostname, hosts)} && exec "$@"', "sh",
            *argv]  # fmt: skip


def words_on_node(namespace: str, hostname: str, hosts: str, words: list[str]) -> list[str]:
    """A command line that runs ssh's remote command (words joined, read by sh) on the node."""
    return [*_enter(namespace), "sh", "-c", f"{_become(hostname, hosts)} && {' '.join(words)}"]


def main(argv: list[str]) -> int:
    while argv and argv[0] in SSH_FLAGS + SSH_VALUED:
        argv = argv[2:] if argv[0] in SSH_VALUED else argv[1:]
    if not argv:
        print("usage: ENTER [-x] HOST [command ...]", file=sys.stderr)
        return 255  # ssh's own status for a connection that never happened
    if len(argv) == 1:  # `ssh node1`: a login shell there, as ssh gives
        argv = [argv[0], 'exec "${SHELL:-/bin/sh}" -i']
    try:
        namespace, hostname = lookup(argv[0], os.environ.get(TABLE_ENV, ""))
    except ValueError as error:
        print(f"minipar (ssh stand-in): {error}", file=sys.stderr)
        return 255
    cmd = words_on_node(namespace, hostname, os.environ.get(HOSTS_ENV, ""), argv[1:])
    os.execvp(cmd[0], cmd)
    return 255  # not reached
