"""The rank side of the warm pool (minipar.testing.pool): one job serves many suites' cases.

    python -m minipar.testing.server HOST:PORT FOLDER [--backend mpi|torch] [--size N]

Under mpiexec every rank runs `serve`; with --backend torch this process imports torch, then
forks N ranks (testing/spawn.py) that bring up gloo and run it. Each rank has torch and
minipar imported once, starts minipar, makes the harness's own control group (not minipar's default
group, which a failed case may leave out of step), connects to the pytest process and says
hello. Then, until told to quit:

    request = the batch the pytest process sent (a suite, case names, env, timeout)
    load the suite, cases(size)
    for each name:
        run the case (output captured, timed)      -> "case" message
        reset this rank, compare notes with peers  -> "synced" message (testing/isolation.py)
    drop the suite, free its groups               -> "done"

Every rank reads the same requests from its own connection (a rank waits for the next one in
the kernel, using no CPU, however long pytest is busy elsewhere); the control group carries
what the ranks must agree on. When a case leaves the job unusable the rank says so in "synced"
and waits for the pytest process to end the job. A rank whose connection closes (pytest gone:
killed, it ended no job) leaves the job without MPI_Finalize, which a peer may never reach:
it removes the shared-memory segments it maps first (MPICH's, its windows'; nobody will
attach to them again), and rank 0 the job's folder.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import shutil
import signal
import sys
import traceback

import minipar
from minipar.launcher import shm_leftovers
from minipar.testing import case, spawn, wire
from minipar.testing.groups import watchdog_paused
from minipar.testing.isolation import Isolation
from minipar.testing.worker import load_suite


def serve(backend: str, address: str, folder: str) -> None:
    _warm()
    comm = minipar.init(backend=backend)
    control = comm.split(list(range(comm.size)), name="harness")
    capture = case.Capture(os.path.join(folder, f"rank{comm.rank}.out"))
    faulthandler.enable()  # a segfault prints where, into the capture file
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # pytest asks where a rank hangs
    isolation = Isolation(backend, control)
    conn = wire.connect(address)
    conn.send({"op": "hello", "rank": comm.rank, "pid": os.getpid(),
               "token": os.environ.get(wire.TOKEN_ENV, "")})  # fmt: skip
    gc.freeze()  # what start-up made is kept: the collections after each batch skip it (zygote.py)
    idle = backend == "mpi"  # between batches no watchdog looks (warm ranks cost no CPU)
    try:
        while True:
            with watchdog_paused(idle, lambda: [control, *isolation.groups.alive()]):
                request = conn.receive()
            if request is None:  # the pytest process is gone: so is this job
                _leave(comm.rank, folder)
            if request["op"] == "quit":
                break
            if not run_batch(request, conn, isolation, comm.size, capture):
                conn.receive()  # the job is spent: wait until pytest ends it
                os._exit(1)
    except ConnectionError:  # gone while this rank sent a case's result
        _leave(comm.rank, folder)
    control.barrier()
    minipar.finalize()


def _leave(rank: int, folder: str) -> None:
    """Leave a job whose pytest process is gone: its segments unlinked, its folder removed."""
    for path in shm_leftovers.mapped([os.getpid()]):
        try:
            os.remove(path)  # the mappings stay valid for the ranks that still hold them
        except OSError:
            pass
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)


def run_batch(request: dict, conn, isolation, size: int, capture) -> bool:
    """Run one batch of cases; False when the job must not serve another."""
    isolation.begin_batch(request)
    try:
        cases = load_suite(request["suite"]).cases(size)
    except BaseException:  # noqa: BLE001  (every case of the batch fails with it)
        cases = _broken(traceback.format_exc())
    isolation.snapshot()
    for name in request["names"]:
        result = case.run(cases.get(name) or _missing(name, size), capture)
        conn.send({"op": "case", "name": name, **result})
        try:
            verdict = isolation.after_case(result["ok"])
        except BaseException:  # noqa: BLE001  (a peer never came: the job is spent)
            verdict = {"error": traceback.format_exc(), "rebuild": True}
        conn.send({"op": "synced", "name": name, **verdict})
        if verdict["rebuild"]:
            return False
    del cases
    try:
        isolation.end_batch(os.path.dirname(os.path.abspath(request["suite"])))
    except BaseException:  # noqa: BLE001
        conn.send({"op": "done", "error": traceback.format_exc(), "rebuild": True})
        return False
    conn.send({"op": "done", "error": None, "rebuild": False})
    return True


def _broken(text: str):
    class Broken(dict):
        def get(self, name, default=None):
            def fails():
                raise RuntimeError(f"the suite could not be loaded:\n{text}")

            return fails

    return Broken()


def _missing(name: str, size: int):
    def fails():
        raise KeyError(f"the suite has no case {name!r} on {size} ranks")

    return fails


def _warm() -> None:
    """What nearly every suite imports, imported once per rank instead of once per launch."""
    try:
        # torch and the strategies (which import it), loaded before the first case: the
        # server's own modules keep them out, so that a rank without torch still serves
        import torch  # noqa: F401

        import minipar.parallel  # noqa: F401
    except ImportError:
        pass


def _spawned(rank: int, address: str, folder: str) -> None:
    serve("torch", address, folder)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address", help="HOST:PORT of the pytest process")
    parser.add_argument("folder", help="the job's folder (capture files)")
    parser.add_argument("--backend", default="mpi", choices=["mpi", "torch"])
    parser.add_argument("--size", type=int, default=1, help="ranks to spawn (torch backend)")
    args = parser.parse_args(argv)
    if args.backend == "mpi":
        serve("mpi", args.address, args.folder)
        return
    _warm()  # once, here: the ranks are forked from this process with torch already loaded
    spawn.spawn(_spawned, (args.address, args.folder), args.size, fork=True)


if __name__ == "__main__":
    sys.exit(main())
