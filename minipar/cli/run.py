"""`minipar run`: a script, a module or any program on N ranks under mpiexec.

    minipar run -n 4 script.py        minipar run -n 4 -m module        minipar run -n 2 hostname

How the job is launched (the right mpiexec, oversubscription, root consent, whole lines per rank,
the timeout) is minipar.launcher.mpiexec's; this module is the command's face: its options,
which program each rank runs, and the messages.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys

from minipar import launcher
from minipar.comm.trace import chrome_trace
from minipar.errors import MPISetupError
from minipar.launcher import faults
from minipar.launcher.cluster import link
from minipar.launcher.cluster.job import emulated
from minipar.launcher.cluster.nodes import EmulationError
from minipar.launcher.relay import Relay, tag_from_env
from minipar.launcher.stop import Terminated
from minipar.launcher.supervisor import Supervisor

EXAMPLES = """\
examples:
  minipar run -n 4 script.py                  script.py on 4 ranks (this Python runs it)
  minipar run -n 4 python script.py --lr 0.1  the mpiexec habit: any program and its arguments
  minipar run -n 8 -m minipar.course.demos.ring_shift   a module (also: python -m MODULE)
  minipar run -n 2 hostname                   any executable on PATH
  minipar run -n 2 -- script.py -n 7          '--' ends minipar's options
  minipar run -n 4 --tag-output script.py     prefix each line with its rank: [rank0]: ...
  minipar run -n 4 --timeout 60 script.py     kill the whole job after 60 s (exit 124)
  minipar run -n 4 --trace out script.py      every rank's timeline: out/trace.json (Perfetto)
  minipar run --nodes 2 -n 4 script.py        2 emulated nodes of 2 ranks, a 2 Gbit/s link
  minipar run --nodes 2 -n 4 --link 500mbit script.py    a slower link (tc's spellings)
  minipar run --nodes 2 -n 4 --fill cyclic script.py     ranks dealt round: 0,2 | 1,3
  minipar run --hosts a:8,b:8 -n 16 train.py  real hosts, passed to the MPI's launcher

Every line a rank prints arrives whole (never mixed with another rank's); MINIPAR_TAG_OUTPUT=1
does what --tag-output does. --trace DIR: each rank records its whole run (from minipar.init()
to finalize() or exit) and writes DIR/rankN.json; at the end they are merged, clocks aligned,
into DIR/trace.json. The exit status is the job's: 0 when every rank exited 0. More
ranks than cores is fine (oversubscribed: waits yield the core instead of spinning). Open MPI
run as root gets OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1. MINIPAR_MPIEXEC picks the mpiexec.
--nodes N: a cluster on this machine (root, or user namespaces: docs/cluster.md): N network
namespaces, each with its own hostname (node0, ...), cabled to a switch at --link's rate; the
MPI's own launcher starts the job on them, TCP carries the bytes between nodes, shared memory
those inside. The namespaces are removed when the job ends, however it ends. Nodes that stay
up between jobs: minipar cluster up.
"""


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    parser.add_argument("-n", "--np", dest="n", type=int, default=1, metavar="N",
                        help="number of ranks (default 1)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="kill the whole job after S seconds and exit 124")  # fmt: skip
    parser.add_argument("--tag-output", action="store_true", default=None,
                        help="prefix lines with the rank, [rank0]:")  # fmt: skip
    parser.add_argument("--trace", metavar="DIR",
                        help="trace every rank; merged into DIR/trace.json at the end")  # fmt: skip
    parser.add_argument("--nodes", type=int, default=None, metavar="N",
                        help="emulated nodes on this machine (docs/cluster.md)")  # fmt: skip
    parser.add_argument("--link", default=None, metavar="RATE",
                        help="the link between emulated nodes: 2gbit (default), 500mbit, "
                             "unlimited")  # fmt: skip
    parser.add_argument("--fill", default="block", choices=["block", "cyclic"],
                        help="emulated nodes: consecutive ranks a node (block, as launchers "
                             "do) or dealt round (cyclic)")  # fmt: skip
    parser.add_argument("--hosts", default=None, metavar="H:N,...",
                        help="real hosts for the MPI's launcher (a:8,b:8)")  # fmt: skip
    parser.add_argument("--hostfile", default=None, metavar="FILE",
                        help="a hostfile for the MPI's launcher")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true",
                        help="print the mpiexec command line instead of running it")  # fmt: skip
    add_restart_flags(parser)
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE ...",
                        help="run a module (python -m MODULE), with its arguments")  # fmt: skip
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="program [args]",
                        help="script.py, or a program (python ...)")  # fmt: skip


def add_restart_flags(parser) -> None:
    """--max-restarts and the faults (launcher/supervisor.py, launcher/faults.py)."""
    parser.add_argument("--max-restarts", type=int, default=None, metavar="N",
                        help="start the job again, up to N times, when a rank, node or link "
                             "dies (dead nodes dropped; docs/checkpoints.md)")  # fmt: skip
    parser.add_argument("--spare-nodes", type=int, default=0, metavar="N",
                        help="with --max-restarts: N spare emulated nodes replace dead ones "
                             "(the layout kept) before nodes are dropped")  # fmt: skip
    parser.add_argument("--fault", action="append", default=[], metavar="SPEC",
                        help="inject a fault: kill-node:1@step=5, pull-link:0@20s, "
                             "kill-rank:3@step=4, kill-node:random@step=9")  # fmt: skip
    parser.add_argument("--fault-seed", type=int, default=0, metavar="S",
                        help="the seed that draws random fault targets (default 0)")  # fmt: skip
    parser.add_argument("--restart-log", metavar="JSON",
                        help="write every attempt and restart (what died, steps and seconds "
                             "lost) as JSON")  # fmt: skip


def restart_problems(args) -> list[str]:
    """What is wrong with --max-restarts and --fault, each naming the flag."""
    found = []
    if args.max_restarts is not None and args.max_restarts < 0:
        found.append(f"--max-restarts must be 0 or more, got {args.max_restarts}")
    if args.spare_nodes < 0 or (args.spare_nodes and not args.nodes):
        found.append(f"--spare-nodes {args.spare_nodes}: 0 or more, with --nodes N")
    try:
        faults.check([faults.parse(f) for f in args.fault], args.nodes, args.n)
    except ValueError as error:
        found.append(str(error))
    if args.nodes and args.n % args.nodes:
        if args.max_restarts:
            found.append(f"--max-restarts on --nodes {args.nodes} needs -n a multiple of it "
                         f"(as many ranks on every node), got -n {args.n}")  # fmt: skip
    return found


def supervised(args, err) -> int:
    """The job under launcher/supervisor.py: restarted on the nodes left, its account printed."""
    for problem in restart_problems(args):
        err.fail(problem)
        return 2

    def attempt(n, cluster):
        return _job(argparse.Namespace(**{**vars(args), "n": n}), err, cluster)

    sup = Supervisor(
        args.n, args.nodes, args.link or link.DEFAULT, args.fill, args.max_restarts or 0,
        [faults.parse(f) for f in args.fault], args.fault_seed, attempt,
        lambda text: err.print(f"minipar run: {text}"), spares=args.spare_nodes,
    )  # fmt: skip
    try:
        rc = sup.run()
    except (ValueError, EmulationError, Terminated) as error:
        return _ended(err, error)
    for line in sup.summary_lines():
        err.print(f"minipar run: {line}")
    if args.restart_log:
        sup.write(args.restart_log)
    return rc


def program(args) -> list[str]:
    """The whole command line each rank runs, from `-m module ...`, `[--] script.py ...` (run by
    this Python) or `[--] program ...` (anything on PATH or a path: python, ./a.out, hostname)."""
    argv = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if args.module:
        if argv:
            raise ValueError("give either -m MODULE or a program, not both")
        return [sys.executable, "-m", *args.module]
    if not argv:
        raise ValueError(
            "nothing to run: give a script (minipar run -n 4 script.py), a program "
            "(minipar run -n 4 python script.py) or -m MODULE"
        )
    first = argv[0]
    if first.startswith("-"):
        raise ValueError(f"unknown option {first!r} before the program")
    if first.endswith(".py") or (os.path.isfile(first) and not os.access(first, os.X_OK)):
        if not os.path.isfile(first):
            raise ValueError(f"no such script: {first}")
        return [sys.executable, *argv]
    if shutil.which(first) is None:
        raise ValueError(f"no such script or program: {first} (not a file, not on PATH)")
    return argv


def main(args) -> int:
    """`minipar run`: the job's output streams through as it happens; returns the job's status."""
    err = _Errors()
    if args.timeout is not None and not args.timeout > 0:  # before anything starts
        err.print(f"[bold red]minipar run:[/] --timeout {args.timeout:g}: give a positive "
                  "number of seconds")  # fmt: skip
        return 2
    if args.nodes is None and args.link is not None:
        err.print("[bold red]minipar run:[/] --link shapes emulated nodes: give --nodes N too")
        return 2
    if args.max_restarts is not None or args.fault:
        return supervised(args, err)
    if args.nodes is None:
        try:
            return _job(args, err, None)
        except Terminated as error:  # the job stopped, what it left removed (launcher/stop.py)
            return _ended(err, error, nodes=False)
    try:
        with emulated(args.nodes, args.link or link.DEFAULT, args.fill) as cluster:
            sys.stderr.write(f"minipar run: {args.nodes} emulated nodes, {link.line(args.link)}\n")
            return _job(args, err, cluster)
    except (ValueError, EmulationError, Terminated) as error:
        return _ended(err, error)


def _ended(err, error, nodes: bool = True) -> int:
    """The status of a job ended by `error`: a signal (128 + it; the job killed, its nodes
    removed) or a refusal (2, said)."""
    if isinstance(error, Terminated):
        removed = ", nodes removed" if nodes else ""
        err.print(f"minipar run: signal {error.signum}, job killed{removed}")
        return 128 + error.signum
    err.fail(str(error))
    return 2


def _job(args, err, cluster) -> int:
    tag = tag_from_env() if args.tag_output is None else args.tag_output
    relay = None if args.dry_run else Relay(max(args.n, 1), tag=tag, fold_errors=True)
    if relay is not None and (args.max_restarts is not None or args.fault):
        relay.quiet_launcher = True  # a lost node is explained by the supervisor, not hydra
    try:
        cmd, env = launcher.command(
            args.n, program(args), python=False, relay=relay, cluster=cluster,
            hosts=args.hosts, hostfile=args.hostfile,
        )  # fmt: skip
    except (ValueError, FileNotFoundError, MPISetupError) as error:
        if relay is not None:
            relay.close()
        err.print(f"[bold red]minipar run:[/] {error}", markup=True)
        return 2
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    if args.trace:
        # here, not at the top of the file: the runtime loads numpy, which `minipar run` need not
        from minipar.runtime import run_trace

        env[run_trace.ENV] = os.path.abspath(args.trace)  # each rank writes its part there
    try:
        done = launcher.run_relayed(cmd, env, relay, args.timeout)
    except Terminated:
        raise  # main() says so, once the nodes are removed
    except KeyboardInterrupt:
        err.print("[bold red]minipar run:[/] interrupted, job killed")
        return 130
    if args.trace:
        merge_trace(args.trace, err)
    if done.returncode == 124 and args.timeout is not None:
        err.print(f"[bold red]minipar run:[/] job killed after {args.timeout:g} s (--timeout)")
    elif done.returncode != 0:
        err.print(f"[bold red]minipar run:[/] job exited with status {done.returncode}")
    if done.returncode != 0 and relay.lost:
        err.print(f"minipar run: {lost_ranks(relay.lost, cluster, args.n)}")
    if cluster is not None and done.returncode != 0:
        err.print(f"minipar run: the emulated nodes were {cluster.describe(args.n)}")
    return done.returncode


def lost_ranks(lost: list[int], cluster, n: int) -> str:
    """'rank 1 (node1 10.200.0.2) ended first, without exiting: ...' (relay.lost_first)."""
    node_of = {}
    if cluster is not None:
        for k, ranks in enumerate(cluster.ranks_on(n)):
            node_of.update({r: f" ({cluster.hostname(k)} {cluster.address(k)})" for r in ranks})
    who = ", ".join(f"rank {r}{node_of.get(r, '')}" for r in lost)
    return (
        f"{who} ended first, without exiting (a signal, a crash, or its node lost)"
        ": its output closed while the job ran, before any rank said it aborts"
    )


class _Errors:
    """rich's Console on stderr, made on the first message: `minipar run` starts every job, and
    rich costs 70 ms of a core to import (a job that goes well says nothing here)."""

    def print(self, *args, **kwargs) -> None:
        from rich.console import Console  # here: a job that goes well never loads rich

        Console(stderr=True, highlight=False, soft_wrap=True).print(*args, **kwargs)

    def fail(self, text: str) -> None:
        """`minipar run: TEXT`, the prefix in red, the text as it is (no markup read in it)."""
        from rich.markup import escape

        self.print(f"[bold red]minipar run:[/] {escape(text)}")


def merge_trace(folder: str, err) -> None:
    """The ranks' parts merged into FOLDER/trace.json (comm/chrome_trace.merge_folder)."""
    try:
        path = chrome_trace.merge_folder(folder)
    except (OSError, ValueError) as error:
        err.print(f"[bold red]minipar run:[/] no trace: {error} (did the program call init()?)")
        return
    err.print(f"minipar run: trace of every rank in {path} (open it in ui.perfetto.dev)")
