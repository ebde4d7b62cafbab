"""`minipar.launch(fn, args=(), n=4)`: run a function on n real MPI ranks from a Python session.

For notebooks and plain interpreters, as accelerate's notebook_launcher or torch.multiprocessing's
spawn, but with MPI underneath: the same mpiexec `minipar run` uses starts n fresh Python
processes, each loads (fn, args), initialises minipar (MPI, the n ranks) and returns fn(*args).
What moves, by way of a private folder:

- in: fn and args pickled once with cloudpickle, which pickles a function defined in `__main__`
  (a notebook cell, the interpreter) by value, so the ranks need not import it;
- out: each rank's return value pickled to `result.RANK`, or its traceback to `error.RANK`;
- output: every rank's lines stream back whole, through minipar.launcher.relay, as they are printed.

A rank that raises writes its traceback, then aborts the MPI job when it had joined one (its
peers would otherwise wait out their timeout); `launch` then raises RankError naming that rank,
with its traceback. The whole process group is killed when the job ends, so no rank outlives it.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
import traceback

from minipar.errors import RankError
from minipar.launcher import mpiexec, relay
from minipar.launcher.cluster.job import emulated
from minipar.runtime import world
from minipar.state import process

PAYLOAD = "payload.pkl"


def launch(
    fn,
    args=(),
    n: int = 4,
    timeout: float | None = None,
    tag_output: bool | None = None,
    nodes: int | None = None,
    link: str = "2gbit",
):
    """Run fn(*args) on n MPI ranks (mpiexec underneath); the ranks' return values, in rank
    order. A rank that raises makes this raise minipar.RankError with its rank number and
    traceback; timeout (seconds) kills the job and raises RankError too. tag_output prefixes
    each line with its rank (default: MINIPAR_TAG_OUTPUT). nodes: on that many emulated nodes
    (as `minipar run --nodes N --link RATE`: root or user namespaces; docs/cluster.md),
    removed when it returns.

    minipar is initialised on every rank before fn runs, as a plain `minipar.init()` there:
    the MPI transport on the n ranks, the timeout from MINIPAR_TIMEOUT (else 300 s), debug
    mode and the fast paths from MINIPAR_DEBUG / MINIPAR_FAST_PATHS, all inherited from this
    process's environment. So fn may call any collective at once. An fn that calls
    minipar.init(...) itself keeps working (init is idempotent; the timeout, debug and
    fast_paths it passes apply from then on), and one that calls init_process_group takes
    the world over ("mpi") or replaces it ("gloo", "nccl") instead of being refused as a
    second initialisation."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n (the number of ranks) must be a positive integer, got {n!r}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of fn's arguments, got {type(args).__name__}")
    if nodes is None:
        return _launch(fn, args, n, timeout, tag_output, None)
    with emulated(nodes, link) as cluster:
        return _launch(fn, args, n, timeout, tag_output, cluster)


def _launch(fn, args, n, timeout, tag_output, cluster):
    import cloudpickle  # here, not at the top: only launching needs it

    folder = tempfile.mkdtemp(prefix="minipar-launch-")
    try:
        with open(os.path.join(folder, PAYLOAD), "wb") as f:
            cloudpickle.dump((fn, tuple(args)), f)
        lines = relay.Relay(n, tag=relay.tag_from_env() if tag_output is None else tag_output)
        try:
            cmd, env = mpiexec.command(
                n, ["-m", "minipar.launcher", "notebook", folder], relay=lines, cluster=cluster
            )
        except BaseException:
            lines.close()
            raise
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        status = mpiexec.run_relayed(cmd, env, lines, timeout).returncode
        return collect(folder, n, status, timeout)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def collect(folder: str, n: int, status: int, timeout: float | None) -> list:
    """The ranks' results in rank order, or RankError for the first rank (in rank order) that
    raised; a job that ended otherwise without every result is an error too."""
    for rank in range(n):
        path = os.path.join(folder, f"error.{rank}")
        if os.path.exists(path):
            with open(path) as f:
                text = f.read()
            raise RankError(f"rank {rank} of {n} raised:\n{text.rstrip()}", rank=rank)
    missing = [r for r in range(n) if not os.path.exists(os.path.join(folder, f"result.{r}"))]
    if status == 124:
        raise RankError(f"the job ran past its timeout of {timeout:g} s and was killed")
    if missing or status != 0:
        raise RankError(
            f"the job exited with status {status}; ranks {missing or 'all'} returned no result "
            "(killed, or the process exited: see the output above)",
            rank=missing[0] if missing else None,
        )
    results = []
    for rank in range(n):
        with open(os.path.join(folder, f"result.{rank}"), "rb") as f:
            results.append(pickle.load(f))
    return results


# -- the rank side: python -m minipar.launcher notebook FOLDER -------------------------------------


def _rank() -> int:
    return int(relay.rank())


def rank_main(folder: str) -> int:
    """Load (fn, args), initialise minipar (see `launch`), call fn, write the result or the
    traceback; abort a started MPI job on error so no peer waits for this rank."""
    rank = _rank()
    try:
        with open(os.path.join(folder, PAYLOAD), "rb") as f:
            fn, args = pickle.load(f)
        world.init("mpi")
        process.launched_world = True  # fn's own init_process_group may take it over
        value = fn(*args)
        data = pickle.dumps(value)
    except BaseException:
        _write(os.path.join(folder, f"error.{rank}"), traceback.format_exc().encode())
        _abort_job()
        return 1
    _write(os.path.join(folder, f"result.{rank}"), data)
    return 0


def _write(path: str, data: bytes) -> None:
    """Write then rename, so the launcher never reads half a file."""
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)


def _abort_job() -> None:
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    if MPI.COMM_WORLD.Get_size() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


def _keep_old_names() -> None:
    """`minipar.launch` was the launcher module before it was this function: code written then
    (`from minipar import launch; launch.run(...)`) keeps working."""
    old = ("run", "run_command", "command", "cores", "find_mpiexec", "mpi_flavor")
    for name in (*old, "mpi_library_version"):
        setattr(launch, name, getattr(mpiexec, name))


_keep_old_names()
