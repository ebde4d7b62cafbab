"""`minipar cluster`: emulated nodes that stay up between jobs (launcher/cluster/standing.py).

    minipar cluster up --nodes 2 [--link 500mbit] [--slurm]
    minipar cluster shell node0 [-- CMD ...]
    minipar cluster status
    minipar cluster down

The command's face: its options and messages; the cluster itself is standing.py's.
"""

from __future__ import annotations

import argparse
import subprocess

from minipar.launcher.cluster import link, needs, standing
from minipar.launcher.cluster.nodes import EmulationError

EXAMPLES = """\
examples:
  minipar cluster up --nodes 2                 2 nodes on a 2 Gbit/s link, up until `down`
  minipar cluster up --nodes 4 --link 500mbit  4 nodes, a slower link
  minipar cluster up --nodes 2 --slurm         and Slurm on them (munge, slurmctld, slurmd)
  minipar cluster shell node0                  a shell on node0; in it, as on a cluster:
      mpiexec -hosts node0:2,node1:2 -n 4 python x.py      ssh node1 hostname
      srun -N 2 --ntasks-per-node=2 --mpi=pmi2 python x.py  sbatch job.sh; squeue; scancel ID
  minipar cluster shell node1 -- ip -s link show eth0   one command on node1
  minipar cluster status                       the nodes, their addresses, their cables' bytes
  minipar cluster down                         everything removed: nodes, daemons, files

The nodes are those of `minipar run --nodes` (docs/cluster.md): network namespaces with their
own hostnames on a switch, each cable shaped by tc; as root, or without root where the kernel
allows user namespaces. A keeper process holds the cluster; if it dies, the next `minipar
cluster`, `minipar run --nodes` or `minipar doctor` removes what it left. One cluster a user.
Slurm is opt-in: apt-get install -y slurm-wlm munge (docs/cluster.md, "Practise on Slurm").
"""


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="make the nodes and keep them up")
    up.add_argument("--nodes", type=int, required=True, metavar="N", help="how many nodes")
    up.add_argument("--link", default=link.DEFAULT, metavar="RATE",
                    help="the link between nodes: 2gbit (default), 500mbit, unlimited")  # fmt: skip
    up.add_argument("--slurm", action="store_true",
                    help="run Slurm on the nodes (slurm-wlm and munge installed)")  # fmt: skip
    shell = sub.add_parser("shell", help="a shell (or one command: -- CMD) on a node")
    shell.add_argument("node", metavar="NODE", help="node0, node1, ...")
    shell.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    sub.add_parser("status", help="the standing cluster, if any")
    sub.add_parser("down", help="remove the cluster: nodes, daemons, files")


def main(args) -> int:
    needs.system_dirs_on_path()  # ip and tc for status and shell too, off a user's PATH
    try:
        return ACTIONS[args.action](args)
    except (ValueError, EmulationError, OSError) as error:
        _say(f"[bold red]minipar cluster {args.action}:[/] {_escape(str(error))}")
        return 2


def _up(args) -> int:
    state = standing.up(args.nodes, args.link, args.slurm)
    _say(f"minipar cluster: {_summary(state)}")
    _say("a shell on node0: minipar cluster shell node0; remove it: minipar cluster down")
    return 0


def _shell(args) -> int:
    state = _standing()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    cmd, env = standing.shell_command(state, args.node, argv)
    if not argv:
        _say(f"minipar cluster: a shell on {args.node} (exit to leave; the cluster stays up)")
    proc = subprocess.Popen(cmd, env=env)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # Ctrl-C is the node's shell's to handle, not ours
            continue


def _status(args) -> int:
    state = standing.find()
    if state is None:
        print("no cluster is up (minipar cluster up --nodes 2)")
        return 1
    print(f"minipar cluster: {_summary(state)}")
    for row in standing.interfaces(state):
        sent = "?" if row["tx"] is None else f"{row['tx']:,} B sent, {row['rx']:,} B received"
        print(f"  {row['hostname']:<6} {row['address']:<12} eth0: {sent}")
    print(f"  files: {state['folder']} (keeper pid {state['keeper']})")
    return 0


def _down(args) -> int:
    state = standing.down()
    if state is None:
        print("no cluster was up")
        return 0
    print(f"minipar cluster: removed its {len(state['nodes'])} nodes, daemons and files")
    return 0


def _standing() -> dict:
    state = standing.find()
    if state is None:
        raise EmulationError("no cluster is up: minipar cluster up --nodes 2")
    return state


def _summary(state: dict) -> str:
    nodes = ", ".join(f"{n['hostname']} {n['address']}" for n in state["nodes"])
    extra = ", Slurm on them" if state["slurm"] else ""
    root = "" if state["holder"] is None else ", without root"
    rate = link.describe(state["link"])
    return f"{len(state['nodes'])} nodes ({nodes}), link {rate}{extra}{root}"


def _say(text: str) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False, soft_wrap=True).print(text)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


ACTIONS = {"up": _up, "shell": _shell, "status": _status, "down": _down}
