"""A small job on emulated nodes (tests/test_cluster.py's endings): an all-reduce across the
nodes, then, by its argument, an ordinary end, a rank that fails, or a wait to be stopped in."""

import sys
import time

import numpy as np

import minipar

minipar.init()
x = np.ones(1 << 16, dtype=np.float32)
minipar.all_reduce(x)
assert np.all(x == minipar.get_world_size())
mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
if mode == "ok" and minipar.get_rank() == 0:  # what `auto` prices the cable at
    print(f"priced between nodes at {1 / minipar.cost.inter_link().beta:.0f} B/s", flush=True)
if mode == "fail" and minipar.get_rank() == 1:
    raise RuntimeError("rank 1 fails on purpose")
if mode == "wait":
    minipar.barrier()
    print("ranks ready", flush=True)
    time.sleep(120)
minipar.finalize()
