"""A job that leaves shared windows open at its end (tests/test_srun_netmod.py, and
test_cluster_slurm.py under srun): a ring all-reduce over each node's own group goes through a
shared window (ring@shm), one across the nodes through the network, and the script ends without
freeing anything, as a student's would (with the argument `finalize`, after minipar.finalize()).
One line a rank: `SUMS rank node_sum world_sum netmod`, netmod as MPIR_CVAR_CH4_NETMOD says."""

import os
import sys

import numpy as np

import minipar

minipar.init()
me = minipar.get_rank()
on_node = np.full(1 << 16, me + 1, dtype=np.float32)
minipar.all_reduce(on_node, group=minipar.runtime.node_groups().intra, algorithm="ring@shm")
everyone = np.full(1 << 16, me + 1, dtype=np.float32)
minipar.all_reduce(everyone)
netmod = os.environ.get("MPIR_CVAR_CH4_NETMOD", "-")
sys.stdout.write(f"SUMS {me} {on_node[0]:g} {everyone[0]:g} {netmod}\n")
sys.stdout.flush()
if sys.argv[1:] == ["finalize"]:
    minipar.finalize()
