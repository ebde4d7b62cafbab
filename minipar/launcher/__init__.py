"""Launching ranks: mpiexec driven from Python, whole lines per rank, functions run on ranks.

    from minipar import launcher
    launcher.run(4, ["script.py"], timeout=60)      # mpiexec -n 4 python script.py, done right

mpiexec.py   find the mpiexec of the MPI mpi4py loads and run a job under it (`minipar run`)
relay.py     each rank's output through its own pipe, forwarded in whole lines
notebook.py  `minipar.launch(fn, args, n)`: a function on n MPI ranks from a notebook
stop.py      ending a job: SIGTERM, a grace, then SIGKILL; hydra's leftovers after an abort
own_folder.py  a process's folders in TMPDIR, named after it: a killed one's are swept
cluster/     emulated nodes on this machine (`minipar run --nodes N --link RATE`)

Light to import: no torch, no MPI.
"""

from minipar.launcher.mpiexec import (
    ROOT_CONSENT,
    command,
    cores,
    find_mpiexec,
    is_root,
    mpi_flavor,
    mpi_library_version,
    run,
    run_command,
    run_relayed,
)

__all__ = [
    "ROOT_CONSENT",
    "command",
    "cores",
    "find_mpiexec",
    "is_root",
    "mpi_flavor",
    "mpi_library_version",
    "run",
    "run_command",
    "run_relayed",
]
