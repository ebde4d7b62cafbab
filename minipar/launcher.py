"""Launching ranks: find the mpiexec that belongs to the MPI mpi4py loads, and run a job under it.

`minipar run -n 4 script.py` is `mpiexec -n 4 python script.py` with the details a laptop gets
wrong: the right mpiexec (a system one next to the pip-installed MPICH hangs or mis-numbers
ranks), oversubscription when ranks outnumber cores (Open MPI refuses without a flag; MPICH's
busy polling would starve the ranks, so minipar's waits yield instead), Open MPI's consent to run
as root (containers, Colab and CI run as root), one OpenMP thread per rank, whole lines per rank
(minipar.relay), and a timeout that kills the whole job so nothing is left behind.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys


def mpi_library_version() -> str:
    """The MPI library's own version string, without initialising MPI (MPISetupError, with the
    fixes, when mpi4py finds no MPI library)."""
    from minipar.mpisetup import load_mpi

    return load_mpi().Get_library_version().replace("\0", "").strip()


def mpi_flavor() -> str:
    """'mpich', 'openmpi', or 'other', from the library's version string."""
    from minipar.mpisetup import flavor

    return flavor(mpi_library_version())


def find_mpiexec() -> str:
    """MINIPAR_MPIEXEC, else the mpiexec installed beside the loaded libmpi (the mpich wheel puts
    both in the environment's prefix), else the first mpiexec on PATH."""
    override = os.environ.get("MINIPAR_MPIEXEC")
    if override:
        return override
    from minipar.mpisetup import library

    candidates = []
    try:
        lib = library()["path"]
        if lib:
            candidates.append(os.path.join(os.path.dirname(os.path.dirname(lib)), "bin"))
    except ImportError:
        pass
    candidates.append(os.path.join(sys.prefix, "bin"))
    for folder in candidates:
        path = os.path.join(folder, "mpiexec")
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise FileNotFoundError(
            "no mpiexec found: pip install mpich (or set MINIPAR_MPIEXEC to your MPI's mpiexec)"
        )
    return found


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


ROOT_CONSENT = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def command(n: int, argv: list[str], python: bool = True, relay=None) -> tuple[list[str], dict]:
    """(the mpiexec command line, its environment) for n ranks running argv (python arguments,
    or a whole program when python is False); with a relay, each rank's output goes through it."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of ranks must be a positive integer, got {n!r}")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [find_mpiexec(), "-n", str(n)]
    openmpi = mpi_flavor() == "openmpi"
    if openmpi and is_root():  # Open MPI refuses root unless told twice; containers run as root
        for name in ROOT_CONSENT:
            env.setdefault(name, "1")
    if n > cores():
        env["MINIPAR_OVERSUBSCRIBED"] = "1"
        if openmpi:
            cmd.append("--oversubscribe")
    program = [sys.executable, *argv] if python else list(argv)
    if relay is not None:
        program = relay.wrap(program)
        relay.environ(env)
    return cmd + program, env


def run(n: int, argv: list[str], timeout: float | None = None, capture: bool = False):
    """Run argv (python arguments) on n ranks; returns the CompletedProcess (exit 124 and the
    whole job killed on timeout). Not captured, the ranks' output arrives in whole lines."""
    if capture:
        cmd, env = command(n, argv)
        return run_command(cmd, env, timeout, capture)
    from minipar.relay import Relay, tag_from_env

    relay = Relay(n, tag=tag_from_env())
    try:
        cmd, env = command(n, argv, relay=relay)
    except BaseException:
        relay.close()
        raise
    return run_relayed(cmd, env, relay, timeout)


def run_relayed(cmd, env, relay, timeout: float | None = None):
    """Run cmd (built with this relay), forwarding the ranks' whole lines as they come."""
    try:
        proc = subprocess.Popen(
            cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except BaseException:
        relay.close()
        raise
    try:
        status = relay.pump(proc, timeout)
    except KeyboardInterrupt:
        _killpg(proc)
        raise
    if status == 124 and timeout is not None:
        sys.stderr.write(f"minipar: job killed after {timeout:g} s (timeout)\n")
    return subprocess.CompletedProcess(cmd, status)


def _killpg(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_command(cmd, env, timeout: float | None = None, capture: bool = False):
    """Run cmd in its own process group, so a timeout or Ctrl-C kills every process it started."""
    kwargs = {"env": env, "start_new_session": True, "text": True}
    if capture:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc = subprocess.Popen(cmd, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err = (err or "") + f"\nminipar: job killed after {timeout:g} s (timeout)\n"
        return subprocess.CompletedProcess(cmd, 124, out, err)
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        try:  # leave no orphans behind, even when the launcher itself exited cleanly
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# -- the `minipar run` command ------------------------------------------------------------------

EXAMPLES = """\
examples:
  minipar run -n 4 script.py                  script.py on 4 ranks (this Python runs it)
  minipar run -n 4 python script.py --lr 0.1  the mpiexec habit: any program and its arguments
  minipar run -n 8 -m minipar.demos.ring_shift   a module (also: python -m MODULE)
  minipar run -n 2 hostname                   any executable on PATH
  minipar run -n 2 -- script.py -n 7          '--' ends minipar's options
  minipar run -n 4 --tag-output script.py     prefix each line with its rank: [rank0]: ...
  minipar run -n 4 --timeout 60 script.py     kill the whole job after 60 s (exit 124)

Every line a rank prints arrives whole (never mixed with another rank's); MINIPAR_TAG_OUTPUT=1
does what --tag-output does. The exit status is the job's: 0 when every rank exited 0. More
ranks than cores is fine (oversubscribed: waits yield the core instead of spinning). Open MPI
run as root gets OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1. MINIPAR_MPIEXEC picks the mpiexec.
"""


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    parser.add_argument("-n", "--np", dest="n", type=int, default=1, metavar="N",
                        help="number of ranks (default 1)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="kill the whole job after S seconds and exit 124")  # fmt: skip
    parser.add_argument("--tag-output", action="store_true", default=None,
                        help="prefix lines with the rank, [rank0]:")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true",
                        help="print the mpiexec command line instead of running it")  # fmt: skip
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE ...",
                        help="run a module (python -m MODULE), with its arguments")  # fmt: skip
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="program [args]",
                        help="script.py, or a program (python ...)")  # fmt: skip


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
    from rich.console import Console

    from minipar.errors import MPISetupError
    from minipar.relay import Relay, tag_from_env

    err = Console(stderr=True, highlight=False)
    tag = tag_from_env() if args.tag_output is None else args.tag_output
    relay = None if args.dry_run else Relay(max(args.n, 1), tag=tag)
    try:
        cmd, env = command(args.n, program(args), python=False, relay=relay)
    except (ValueError, FileNotFoundError, MPISetupError) as error:
        if relay is not None:
            relay.close()
        err.print(f"[bold red]minipar run:[/] {error}", markup=True)
        return 2
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    try:
        done = run_relayed(cmd, env, relay, args.timeout)
    except KeyboardInterrupt:
        err.print("[bold red]minipar run:[/] interrupted, job killed")
        return 130
    if done.returncode == 124 and args.timeout is not None:
        err.print(f"[bold red]minipar run:[/] job killed after {args.timeout:g} s (--timeout)")
    elif done.returncode != 0:
        err.print(f"[bold red]minipar run:[/] job exited with status {done.returncode}")
    return done.returncode
