"""Transports: how the bytes of one buffer get from one rank to another.

base.py is the interface (Communicator, Request, timeouts); mpi.py implements it on mpi4py,
torch.py on torch.distributed point-to-point; cuda.py handles device buffers for MPI.
"""

from minipar.comm.base import Communicator, NonMember, Request, wait_all

__all__ = ["Communicator", "NonMember", "Request", "wait_all"]
