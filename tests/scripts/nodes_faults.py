"""Faults only a cluster has (tests/test_cluster.py): all-reduces across the nodes until rank 0
pulls its node's cable (link_down: `ip link set eth0 down` inside node0), or the last node's
ranks all die at once (node_killed)."""

import os
import signal
import subprocess
import sys

import numpy as np

import minipar

mode = sys.argv[1]
minipar.init()
x = np.ones(1 << 16, dtype=np.float32)
for i in range(1000):
    if i == 3 and mode == "link_down" and minipar.get_rank() == 0:
        subprocess.run(["ip", "link", "set", "eth0", "down"], check=True)
        print("rank 0: pulled node0's cable", flush=True)
    if i == 3 and mode == "node_killed" and minipar.node_rank() == minipar.num_nodes() - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    minipar.all_reduce(x, algorithm="ring")
print("unreachable: the job should have failed", flush=True)
