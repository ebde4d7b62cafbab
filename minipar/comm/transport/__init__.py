"""The transport: how the bytes of one buffer get from one rank to another (MPI, torch.distributed,
shared-memory windows inside a node). Read base.py first, then mpi.py. See ../__init__.py."""
