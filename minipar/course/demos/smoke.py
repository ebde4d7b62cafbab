"""The smoke job of `minipar doctor`: can ranks start, talk, and agree? What can this MPI do?

    minipar run -n 2 -m minipar.course.demos.smoke

Each rank sends its rank number around a ring (one sendrecv: 8 bytes to the right, 8 from the
left) and all-reduces a small vector with minipar's ring. Rank 0 also asks the MPI library what it
can do once initialised (thread level, CUDA-aware transfers) and prints one line of JSON,
prefixed with `MINIPAR_SMOKE `, that the doctor reads back.
"""

from __future__ import annotations

import json
import time

import numpy as np

import minipar
from minipar.collectives.fast import routing
from minipar.comm.transport import shm
from minipar.comm.transport.cuda import mpi_cuda_aware
from minipar.runtime import devices
from minipar.state import process

PREFIX = "MINIPAR_SMOKE "
THREAD_LEVELS = ["MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED",
                 "MPI_THREAD_MULTIPLE"]  # fmt: skip


def ring_ok(comm) -> bool:
    """Rank r sends r to r+1 and must receive r-1 from the left."""
    mine, got = np.array([comm.rank], dtype=np.int64), np.full(1, -1, dtype=np.int64)
    comm.sendrecv(mine, (comm.rank + 1) % comm.size, got, (comm.rank - 1) % comm.size)
    return int(got[0]) == (comm.rank - 1) % comm.size


def all_reduce_ok(comm) -> bool:
    """Everyone adds up 0..size-1 in every slot of a 1000-element vector."""
    x = np.full(1000, comm.rank, dtype=np.float64)
    minipar.all_reduce(x, algorithm="ring")
    return bool(np.all(x == comm.size * (comm.size - 1) / 2))


def shm_ok(comm):
    """The all-reduce over shared windows (comm/transport/shm.py): True if right, None if this group
    cannot share memory (it spans nodes, or has one rank)."""
    if comm.size == 1 or shm.node_of(comm) is None:
        return None
    x = np.full(1000, comm.rank, dtype=np.float64)
    minipar.all_reduce(x, algorithm="ring@shm")
    return bool(np.all(x == comm.size * (comm.size - 1) / 2))


def library_facts() -> dict:
    """What the initialised MPI says about itself (asked after MPI_Init: MPICH refuses before)."""
    from mpi4py import MPI

    aware, why = mpi_cuda_aware()
    return {
        "thread_level": _name(MPI.Query_thread()),
        "cuda_aware": aware,
        "cuda_aware_why": why,
        "processor": MPI.Get_processor_name(),
    }


def _name(level: int) -> str:
    from mpi4py import MPI

    for name in THREAD_LEVELS:
        if getattr(MPI, name[4:]) == level:
            return name
    return f"level {level}"


def main() -> None:
    start = time.perf_counter()
    comm = minipar.init()
    ok = {"ring": ring_ok(comm), "all_reduce": all_reduce_ok(comm), "shm": shm_ok(comm)}
    where = routing.describe(comm)  # collective: every rank asks
    ok["local_rank"], ok["local_rank_from"] = devices.local_rank(), process.local_rank_source
    everyone = comm.allgather_object(ok)
    if comm.rank == 0:
        facts = library_facts()
        facts.update(
            size=comm.size,
            ring_ok=all(r["ring"] for r in everyone),
            all_reduce_ok=all(r["all_reduce"] for r in everyone),
            shm_ok=all(r["shm"] is not False for r in everyone),
            shm_used=all(r["shm"] for r in everyone),
            transport=where,
            seconds=round(time.perf_counter() - start, 3),
            local_ranks=[r["local_rank"] for r in everyone],
            local_rank_from=everyone[0]["local_rank_from"],
            nodes=list(process.nodes.names),
            node_of=list(process.nodes.node_of),
            nodes_from=process.nodes.source,
        )
        print(PREFIX + json.dumps(facts), flush=True)
    comm.barrier()
    minipar.finalize()


if __name__ == "__main__":
    main()
