"""How each MPI's launcher is told about the nodes, and which transport carries bytes between them.

| what                     | MPICH's hydra (mpiexec)           | Open MPI 5 (mpirun)             |
| ------------------------ | --------------------------------- | ------------------------------- |
| the hosts, ranks on each | -hosts 10.200.0.1:2,10.200.0.2:2  | --host 10.200.0.1:2,...         |
| a hostfile               | -f FILE                           | --hostfile FILE                 |
| start a proxy on a host  | -launcher ssh -launcher-exec ENTER | --prtemca plm_ssh_agent ENTER  |
| bytes between nodes      | UCX_TLS=tcp,self (OFI: tcp)       | --mca pml ob1 --mca btl tcp,... |
| on which interface       | UCX_NET_DEVICES=eth0              | --mca btl_tcp_if_include eth0   |

Both launchers fill the hosts in order (ranks 0..k-1 on the first), as a cluster's launcher
fills nodes; `--fill cyclic` deals them round instead (hydra: one slot a host, wrapped; Open
MPI: --map-by node), which puts a mesh's tp neighbours on different nodes. The transport must
be forced: the mpich wheel's UCX finds /dev/shm, which every emulated node shares (one
machine), and would move the "inter-node" bytes through memory, bypassing the link. Inside a
node both MPIs use shared memory, as on a real node.
"""

from __future__ import annotations

import os
import sys

from minipar.launcher.cluster.enter import HOSTS_ENV, TABLE_ENV

INTERFACE = "eth0"


def slots(n: int, n_nodes: int) -> list[int]:
    """Ranks per node: n/N each, the first n % N nodes one more (Slurm's block distribution)."""
    if not isinstance(n_nodes, int) or n_nodes < 1:
        raise ValueError(f"--nodes must be a positive integer, got {n_nodes!r}")
    if n < n_nodes:
        raise ValueError(f"-n {n} ranks cannot fill --nodes {n_nodes} (a node would be empty)")
    return [n // n_nodes + (1 if k < n % n_nodes else 0) for k in range(n_nodes)]


def host_list(hosts: list[str], counts: list[int]) -> str:
    return ",".join(f"{h}:{c}" for h, c in zip(hosts, counts))


def write_stand_in(folder: str, name: str = "enter") -> str:
    """The executable the launcher runs instead of ssh: this Python, minipar's enter.py."""
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" -m minipar.launcher enter "$@"\n')
    os.chmod(path, 0o755)
    return path


def for_cluster(flavor: str, cluster, n: int) -> tuple[list[str], dict]:
    """(launcher arguments, environment) for n ranks on an EmulatedCluster."""
    cyclic = cluster.fill == "cyclic"
    counts = slots(n, cluster.n_nodes)
    agent = write_stand_in(cluster.folder)
    env = {TABLE_ENV: cluster.table(), HOSTS_ENV: cluster.hosts_file}
    if flavor == "openmpi":
        args = ["--host", host_list(cluster.hosts, counts), "--bind-to", "none",
                *(["--map-by", "node"] if cyclic else []),
                "--prtemca", "plm_ssh_agent", agent,
                "--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp",
                "--mca", "btl_tcp_if_include", INTERFACE]  # fmt: skip
        return args, env
    env.update(UCX_TLS="tcp,self", UCX_NET_DEVICES=INTERFACE, FI_PROVIDER="tcp")
    env.update(FI_TCP_IFACE=INTERFACE)
    if cyclic:  # one slot a host: hydra deals the ranks round the hosts
        counts = [1] * cluster.n_nodes
    hosts = host_list(cluster.hosts, counts)
    return ["-launcher", "ssh", "-launcher-exec", agent, "-hosts", hosts], env


def for_hosts(flavor: str, hosts: str | None, hostfile: str | None) -> list[str]:
    """Real hosts, passed through: `--hosts a:8,b:8` or `--hostfile FILE`."""
    if hosts and hostfile:
        raise ValueError("give --hosts or --hostfile, not both")
    if hostfile:
        if not os.path.isfile(hostfile):
            raise ValueError(f"--hostfile {hostfile!r}: no such file")
        return ["--hostfile", hostfile] if flavor == "openmpi" else ["-f", hostfile]
    if hosts:
        return ["--host", hosts] if flavor == "openmpi" else ["-hosts", hosts]
    return []
