"""A dead job's shared-memory segments do not stay in /dev/shm (launcher/shm_leftovers.py): a
real 2-rank MPICH job holding a shared window is killed as a timeout kills it (stop.stop), or
ends itself by MPI_Abort under the launcher, and its segments are gone; one that a live process
maps is kept."""

import os
import subprocess
import sys
import time

import pytest

from minipar import launcher
from minipar.launcher import shm_leftovers, stop

HOLD = """
import sys, time
from mpi4py import MPI
node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
win = MPI.Win.Allocate_shared(1 << 20 if node.rank == 0 else 0, 1, comm=node)
node.Barrier()
print("holding", flush=True)
time.sleep(120)
"""


@pytest.mark.own_job
@pytest.mark.cold
def test_a_killed_jobs_segments_are_removed():
    proc = subprocess.Popen(
        [launcher.find_mpiexec(), "-n", "2", sys.executable, "-c", HOLD],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        said = ""
        while said.count("holding") < 2:  # both ranks hold the window (their lines may mix)
            line = proc.stdout.readline()
            assert line, f"the job ended before both ranks held the window: {said!r}"
            said += line
        held = shm_leftovers.mapped(shm_leftovers.tree(proc.pid))
        assert held and all(os.path.exists(p) for p in held), held  # the window's segment
        assert not shm_leftovers.remove(held)  # mapped by a live rank: kept
        stop.stop(proc, grace=0.0)  # SIGKILL at once: no rank frees its window
        time.sleep(0.2)
        left = [p for p in held if os.path.exists(p)]
        assert not left, f"the killed job left {left}"
    finally:
        stop.signal_pid(-proc.pid, 9)
        proc.wait()
        proc.stdout.close()


ABORT = """
from mpi4py import MPI
node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
win = MPI.Win.Allocate_shared(1 << 20 if node.rank == 0 else 0, 1, comm=node)
node.Barrier()
with open("/proc/self/maps") as f:
    held = {line.split()[5] for line in f if "/dev/shm/mpich" in line}
held = sorted(path for path in held if not path.endswith("(deleted)"))
print("HELD", *held, flush=True)
node.Barrier()
MPI.COMM_WORLD.Abort(3)
"""


@pytest.mark.own_job
@pytest.mark.cold
def test_an_aborted_jobs_segments_are_removed():
    done = launcher.run(2, ["-c", ABORT], timeout=60, capture=True)
    assert done.returncode != 0, done.stdout + done.stderr
    held = {
        p for line in done.stdout.splitlines() if line.startswith("HELD") for p in line.split()[1:]
    }
    assert held, done.stdout + done.stderr
    left = [p for p in held if os.path.exists(p)]
    assert not left, f"the aborted job left {left}"
