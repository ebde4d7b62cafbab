"""Where each rank runs (tests/test_cluster_rootless.py, _standing.py, _slurm.py): one line a rank,
`WHERE rank node_rank local_rank num_nodes hostname`, after an all-reduce of 1 MiB across the
nodes whose sum is checked (so the cables carry bytes)."""

import socket
import sys

import numpy as np

import minipar

minipar.init()
x = np.full(1 << 18, minipar.get_rank() + 1, dtype=np.float32)
minipar.all_reduce(x)
n = minipar.get_world_size()
assert np.all(x == n * (n + 1) / 2), x[:4]
where = (minipar.get_rank(), minipar.node_rank(), minipar.local_rank(), minipar.num_nodes())
line = " ".join(["WHERE", *map(str, where), socket.gethostname()])
sys.stdout.write(line + "\n")  # one write: plain mpiexec forwards what each write gives it
sys.stdout.flush()
minipar.finalize()
