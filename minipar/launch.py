"""Launching ranks: find the mpiexec that belongs to the MPI mpi4py loads, and run a job under it.

`minipar run -n 4 script.py` is `mpiexec -n 4 python script.py` with the details a laptop gets
wrong: the right mpiexec (a system one next to the pip-installed MPICH hangs or mis-numbers
ranks), oversubscription when ranks outnumber cores (Open MPI refuses without a flag; MPICH's
busy polling would starve the ranks, so minipar's waits yield instead), one OpenMP thread per
rank, and a timeout that kills the whole job so nothing is left behind.
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
    """The MPI library's own version string, without initialising MPI."""
    import mpi4py

    mpi4py.rc.initialize = False
    from mpi4py import MPI

    return MPI.Get_library_version().strip()


def mpi_flavor() -> str:
    """'mpich', 'openmpi', or 'other', from the library's version string."""
    version = mpi_library_version().lower()
    if "open mpi" in version:
        return "openmpi"
    if "mpich" in version or "intel" in version or "mvapich" in version:
        return "mpich"
    return "other"


def find_mpiexec() -> str:
    """MINIPAR_MPIEXEC, else the mpiexec installed beside the loaded libmpi (the mpich wheel puts
    both in the environment's prefix), else the first mpiexec on PATH."""
    override = os.environ.get("MINIPAR_MPIEXEC")
    if override:
        return override
    candidates = []
    try:
        import mpi4py

        mpi4py.rc.initialize = False
        from minipar.comm.cuda import loaded_mpi_library

        lib = loaded_mpi_library()
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


def command(n: int, argv: list[str], python: bool = True) -> tuple[list[str], dict]:
    """(the mpiexec command line, its environment) for n ranks running argv."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of ranks must be a positive integer, got {n!r}")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [find_mpiexec(), "-n", str(n)]
    if n > cores():
        env["MINIPAR_OVERSUBSCRIBED"] = "1"
        if mpi_flavor() == "openmpi":
            cmd.append("--oversubscribe")
    cmd += [sys.executable, *argv] if python else argv
    return cmd, env


def run(n: int, argv: list[str], timeout: float | None = None, capture: bool = False):
    """Run argv (python arguments) on n ranks; returns the CompletedProcess (exit 124 and the
    whole job killed on timeout)."""
    cmd, env = command(n, argv)
    return run_command(cmd, env, timeout, capture)


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
  minipar run -n 4 script.py                  script.py on 4 ranks
  minipar run -n 4 script.py --lr 0.1         arguments after the script go to the script
  minipar run -n 2 -- script.py -n 7          '--' ends minipar's options
  minipar run -n 8 -m minipar.demos.ring_shift   a module instead of a script
  minipar run -n 4 --timeout 60 script.py     kill the whole job after 60 s (exit 124)

The exit status is the job's: 0 when every rank exited 0. More ranks than cores is fine
(oversubscribed: waits yield the core instead of spinning). MINIPAR_MPIEXEC picks the mpiexec.
"""


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    parser.add_argument("-n", "--np", dest="n", type=int, default=1, metavar="N",
                        help="number of ranks (default 1)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="kill the whole job after S seconds and exit 124")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true",
                        help="print the mpiexec command line instead of running it")  # fmt: skip
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE ...",
                        help="run a module (python -m MODULE), with its arguments")  # fmt: skip
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="script.py [args]",
                        help="the script and its arguments")  # fmt: skip


def python_argv(args) -> list[str]:
    """The python arguments of the job, from `-m module ...` or `[--] script.py ...`."""
    argv = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if args.module:
        if argv:
            raise ValueError("give either -m MODULE or a script, not both")
        return ["-m", *args.module]
    if not argv:
        raise ValueError("nothing to run: give a script (minipar run -n 4 script.py) or -m MODULE")
    if argv[0].startswith("-"):
        raise ValueError(f"unknown option {argv[0]!r} before the script")
    if not os.path.exists(argv[0]):
        raise ValueError(f"no such script: {argv[0]}")
    return argv


def main(args) -> int:
    """`minipar run`: the job's output streams through as it happens; returns the job's status."""
    from rich.console import Console

    err = Console(stderr=True, highlight=False)
    try:
        cmd, env = command(args.n, python_argv(args))
    except (ValueError, FileNotFoundError) as error:
        err.print(f"[bold red]minipar run:[/] {error}")
        return 2
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    try:
        done = run_command(cmd, env, args.timeout, capture=False)
    except KeyboardInterrupt:
        err.print("[bold red]minipar run:[/] interrupted, job killed")
        return 130
    if done.returncode == 124 and args.timeout is not None:
        err.print(f"[bold red]minipar run:[/] job killed after {args.timeout:g} s (--timeout)")
    elif done.returncode != 0:
        err.print(f"[bold red]minipar run:[/] job exited with status {done.returncode}")
    return done.returncode
