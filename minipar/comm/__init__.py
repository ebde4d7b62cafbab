"""How bytes get from one rank to another, in four rooms (read transport/ first):

transport/     the transport: how the bytes of one buffer go from one rank to another
  base.py        the interface: Communicator, Request, timeouts, the tags of collective calls,
                 the node a peer is on when a wait times out
  buffers.py     numpy arrays and torch tensors seen as flat runs of bytes
  mpi.py         the interface on mpi4py (mpi_requests.py its requests; cuda.py, staging.py and
                 mpi_staged.py device buffers, direct or staged through pinned host memory)
  torch.py       the interface on torch.distributed point-to-point (gloo, nccl)
  shm.py         MPI shared-memory windows between the ranks of a node (never across nodes);
                 shm_buffers.py buffers that live in a window from the start
trace/         what moved, recorded
  ledger.py      the trace ledger: every message this rank sends and receives (and whether it
                 crossed between nodes)
  signature.py   what a collective call's tag carries: its sequence number and a hash of its
                 arguments, so ranks that disagree never match
  chrome_trace.py, trace_png.py   every rank's ledger as one timeline, and drawn as a PNG
guards/        mismatches and departures caught, off the path
  watchdog.py    mismatched calls found off the path; leaving.py a rank leaving while others
                 wait for it; stall.py a wait that lasts asks its peers which call they are in;
                 notices.py the messages between ranks about a mismatch; ending.py the ranks
                 compare their groups' calls at finalize() and exit
setup/         mpisetup.py: the MPI library and launcher found, and a wrong pair diagnosed

Importing this package is light; each module loads what it needs (numpy, mpi4py) itself. The
modules' names from before the rooms (`minipar.comm.ledger`, `from minipar.comm import mpi`)
still import, as the same modules (_OldNames below).
"""

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {  # module -> its room
    **dict.fromkeys(
        (
            "base",
            "buffers",
            "mpi",
            "mpi_requests",
            "mpi_staged",
            "cuda",
            "staging",
            "torch",
            "shm",
            "shm_buffers",
        ),
        "transport",
    ),  # fmt: skip
    **dict.fromkeys(("ledger", "signature", "chrome_trace", "trace_png"), "trace"),
    **dict.fromkeys(("watchdog", "stall", "notices", "ending", "leaving"), "guards"),
    "mpisetup": "setup",
}


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import minipar.comm.ledger` (a name from before the rooms) gives the module itself,
    minipar.comm.trace.ledger: one module under two names, never two copies."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, name = fullname.rpartition(".")
        if head == __name__ and name in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"{__name__}.{MOVED[spec.name.rpartition('.')[2]]}."
                                       f"{spec.name.rpartition('.')[2]}")  # fmt: skip

    def exec_module(self, module):
        pass


if not any(isinstance(f, _OldNames) for f in sys.meta_path):
    sys.meta_path.append(_OldNames())


def __getattr__(name: str):
    """`from minipar.comm import ledger` (an old name) loads it from its room."""
    if name in MOVED:
        return importlib.import_module(f"{__name__}.{MOVED[name]}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
