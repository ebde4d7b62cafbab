"""minipar under torchrun: init(backend="auto") adopts torch.distributed from torchrun's
environment and every all-reduce algorithm runs over the torch transport."""

import os
import shutil
import sys

import pytest
from conftest import ROOT

from minipar import launcher

pytestmark = pytest.mark.own_job  # torchrun starts the ranks itself


def test_torchrun_two_ranks(tmp_path):
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    script = os.path.join(ROOT, "tests", "scripts", "torchrun_allreduce.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", MINIPAR_OVERSUBSCRIBED="1")
    env["TMPDIR"] = str(tmp_path)  # torchrun leaves its torchelastic_* folder there
    for var in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        env.pop(var, None)
    cmd = [torchrun, "--standalone", "--nproc_per_node", "2", script]
    done = launcher.run_command(cmd, env, timeout=120, capture=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "rank 0 of 2: ok" in done.stdout and "rank 1 of 2: ok" in done.stdout
