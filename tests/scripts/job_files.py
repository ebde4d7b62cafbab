"""A job that says which files it made (tests/test_launcher.py's endings): each rank prints
`MADE rank pid DEVICE PATH ...`: the device of the /dev/shm it sees, the MPICH segments it maps
(/proc/self/maps) and hydra's topology file its proxy holds open; then `ranks ready`; then,
by its argument, it waits to be stopped (wait), has rank 1 SIGKILL itself (die), or call
MPI_Abort itself (abort)."""

import os
import signal
import sys
import time

from mpi4py import MPI

import minipar


def segments() -> list[str]:
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/dev/shm/mpich_" in line}
    return sorted(p for p in paths if os.path.exists(p))  # not the unlinked ones


def topology_files() -> list[str]:
    """What this rank's nearest hydra proxy (a parent) holds open under /tmp/hydra_*."""
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the parent
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "hydra_pmi_proxy":
                continue
        fds = f"/proc/{pid}/fd"
        links = [os.readlink(os.path.join(fds, fd)) for fd in os.listdir(fds)]
        return [p for p in links if p.startswith("/tmp/hydra_")]
    return []


minipar.init()  # up: `minipar run` names a rank that ends without exiting
comm = MPI.COMM_WORLD
comm.allreduce(1)
shm = os.stat("/dev/shm").st_dev
said = " ".join(map(str, ("MADE", comm.rank, os.getpid(), shm, *segments(), *topology_files())))
os.write(1, (said + "\n").encode())  # one write: two ranks' lines on one pipe never interleave
comm.Barrier()
if comm.rank == 0:  # one write too (print may write the line and its newline apart)
    os.write(1, b"ranks ready\n")
mode = sys.argv[1] if len(sys.argv) > 1 else "wait"
if mode == "die" and comm.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "abort" and comm.rank == 1:
    comm.Abort(3)
time.sleep(120)
