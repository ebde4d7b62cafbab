"""The soak's short form: randomized calls on 3 ranks, every result checked against numpy on
every rank (scripts/soak.py; its full form's result is in docs/errors.md)."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.own_job  # a script of its own under `minipar run`
SOAK = os.path.join(ROOT, "scripts", "soak.py")


def test_soak_short():
    argv = ["-m", "minipar", "run", "-n", "3", SOAK, "--calls", "150", "--max-bytes", "64KiB"]
    env = dict(os.environ, MINIPAR_TIMEOUT="10", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, *argv, "--seed", "16"], capture_output=True, text=True, timeout=240,
        env=env, cwd=ROOT,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "soak: seed 16: 150 calls on 3 ranks, all results right" in output, output[-4000:]
