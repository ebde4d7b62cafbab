"""A rank that raises in the middle of a DDP, FSDP, tensor-parallel or pipeline step
ends the whole job non-zero within seconds, with that rank's traceback, on the MPI transport
(`minipar run`) and on torch.distributed (gloo, ranks forked by torch.multiprocessing:
tests/faults/inject.py covers the spawned ones). The jobs are in
tests/faults/strategies.py; they start together on a few threads, and each test checks one.
"""

import functools
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import conftest
import pytest
from conftest import ROOT

SCRIPT = os.path.join(ROOT, "tests", "faults", "strategies.py")
TIMEOUT = 3  # MINIPAR_TIMEOUT inside the jobs
SLACK = 25  # seconds beyond TIMEOUT a job may take to end after its fault (abort, teardown)
JOB_LIMIT = 150
pytestmark = pytest.mark.own_job  # the faults end their jobs: each needs one of its own

# (transport, strategy, exit instead of raise): fragments the output must hold
EXPECT = {
    ("mpi", "ddp", False): ["[rank 1] RuntimeError: injected fault (ddp)", "minipar: aborting"],
    ("mpi", "fsdp", False): ["[rank 1] RuntimeError: injected fault (fsdp)", "minipar: aborting"],
    ("mpi", "tp", False): ["[rank 1] RuntimeError: injected fault (tp)", "minipar: aborting"],
    ("mpi", "pp", False): ["[rank 1] RuntimeError: injected fault (pp)", "minipar: aborting"],
    ("torch", "ddp", False): ["Process 1 terminated", "injected fault (ddp)"],
    ("torch", "fsdp", False): ["Process 1 terminated", "injected fault (fsdp)"],
    ("torch", "tp", False): ["Process 1 terminated", "injected fault (tp)"],
    ("torch", "pp", False): ["Process 1 terminated", "injected fault (pp)"],
}


def command(transport, strategy, exit_instead):
    flags = ["--exit"] if exit_instead else []
    if transport == "mpi":
        return [sys.executable, "-m", "minipar", "run", "-n", "2", SCRIPT, strategy, *flags]
    return [sys.executable, SCRIPT, strategy, "--torch", "2", *flags]


def run_job(key):
    return conftest.run_job(command(*key), TIMEOUT, JOB_LIMIT)


@functools.cache
def results():
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(EXPECT, pool.map(run_job, EXPECT)))


@pytest.mark.parametrize("key", list(EXPECT), ids=["-".join(map(str, k)) for k in EXPECT])
def test_fault_in_strategy(key):
    rc, output, start, end, _ = results()[key]
    where = f"{' '.join(command(*key)[1:])} exited {rc} after {end - start:.1f} s"
    assert rc != 124, f"{where}: the job hung\n{output[-3000:]}"
    assert rc != 0, f"{where}: a rank failed but the job succeeded\n{output[-3000:]}"
    assert "finished" not in output, f"{where}: a rank carried on\n{output[-3000:]}"
    for fragment in EXPECT[key]:
        assert fragment in output, f"{where}: {fragment!r} not in the output\n{output[-3000:]}"
    fault = re.search(r"\[fault\] rank \d+ \S+ at ([0-9.]+)", output)
    assert fault, f"{where}: the fault never happened\n{output[-3000:]}"
    took = end - float(fault.group(1))
    assert took < TIMEOUT + SLACK, f"{where}: ended {took:.1f} s after the fault"
