"""Transports: how the bytes of one buffer get from one rank to another.

base.py        the interface: Communicator, Request, timeouts, the tags of collective calls
buffers.py     numpy arrays and torch tensors seen as flat runs of bytes
mpi.py         the interface on mpi4py (mpi_requests.py its requests; cuda.py, staging.py and
               mpi_staged.py device buffers, direct or staged through pinned host memory)
torch.py       the interface on torch.distributed point-to-point (gloo, nccl)
shm.py         MPI shared-memory windows between the ranks of a node
ledger.py      the trace ledger: every message this rank sends and receives
signature.py   what a collective call's tag carries: its sequence number and a hash of its
               arguments, so ranks that disagree never match
watchdog.py    mismatched calls found off the path; leaving.py a rank leaving while others
               wait for it; stall.py a wait that lasts asks its peers which call they are in;
               notices.py the messages between ranks about a mismatch; ending.py the ranks
               compare their groups' calls at finalize() and exit
mpisetup.py    the MPI library and launcher found, and a wrong pair diagnosed

Importing this package is light; each module loads what it needs (numpy, mpi4py) itself.
"""
