"""Slurm on the emulated nodes (minipar cluster up --slurm; launcher/cluster/slurm.py).

- `srun -N 2 --ntasks-per-node=2 --mpi=pmi2 python x.py` from node0's shell: two tasks a node,
  minipar's node map right (MPICH learns the nodes from Slurm's PMI-2; Open MPI, under CI's
  Open MPI part, from its PMIx: --mpi=pmix), 1 MiB all-reduced
  across the cable; `sbatch` runs the same as a batch job, `squeue` lists a second job and
  `scancel` ends it; down, then no daemon, namespace or file left;
- the keeper killed: the next `minipar cluster status` sweeps the nodes, every daemon with them;
- refused before anything starts where Slurm is not installed, or without root;
- Slurm's PMI-2 plugin reads a PMI-1 request in one read of 1024 bytes: a `put` longer than that
  is cut ("value not properly terminated"); MPICH's UCX netmod can send one under srun
  (docs/cluster.md, "Practise on Slurm");
- so under `srun --mpi=pmi2` on two nodes minipar starts the mpich wheel on its OFI netmod (rank
  0 says so), and a job that leaves shared windows open ends with status 0 (issue 69).
The daemons' checks run with MINIPAR_EXTENDED=1 (CI's cluster step, which installs Slurm: about
45 s, 20 up/down cycles with Slurm included) and are skipped with the reason where Slurm and
munge are not installed (apt-get install -y slurm-wlm munge) or without root.
"""

import json
import os
import signal
import sys
import time

import pytest
from conftest import ROOT
from test_cluster_standing import (
    FOUR_ON_TWO,
    WHERE,
    Commands,
    emulation,
    keeper_of,
    machine,
    nothing_left,
    where,
)

from minipar.launcher import mpiexec
from minipar.launcher.cluster import rootless, slurm
from minipar.testing import harness

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
SHM_AT_EXIT = os.path.join(ROOT, "tests", "scripts", "shm_at_exit.py")
LACKS = slurm.missing()
installed = pytest.mark.skipif(
    bool(LACKS) or rootless.wanted(),
    reason=f"Slurm: {'not installed (' + ', '.join(LACKS) + ')' if LACKS else 'needs root'}",
)
# MPICH through Slurm's PMI-2, Open MPI through its PMIx (CI's Open MPI part runs this file too)
PMI = "--mpi=pmix" if mpiexec.mpi_flavor() == "openmpi" else "--mpi=pmi2"
SRUN = f"srun -N 2 --ntasks-per-node=2 {PMI} {sys.executable} {WHERE}"
BATCH = f"""#!/bin/sh
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH -o batch.out
{SRUN}
"""


@pytest.fixture
def cluster_cli():
    commands = Commands()
    try:
        yield commands
    finally:
        commands.close()


LONG = "#!/bin/sh\n#SBATCH -N 1\n#SBATCH -o /dev/null\nsleep 300\n"


def test_refused_where_slurm_cannot_run(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    monkeypatch.setattr(rootless, "wanted", lambda: False)
    with pytest.raises(slurm.EmulationError, match="apt-get install -y slurm-wlm munge"):
        slurm.check()
    monkeypatch.setattr(rootless, "wanted", lambda: True)
    with pytest.raises(slurm.EmulationError, match="--slurm needs root: .*setgroups"):
        slurm.check()


def test_the_configuration_names_every_node_and_keeps_files_in_the_folder():
    from minipar.launcher.cluster.nodes import EmulatedCluster

    conf = slurm.config(EmulatedCluster(3), "/f")
    assert "SlurmctldHost=node0(10.200.0.1)" in conf
    for k in range(3):
        assert f"NodeName=node{k} NodeAddr=10.200.0.{k + 1} CPUs=" in conf
    paths = [line.split("=", 1)[1] for line in conf.splitlines() if line.split("=")[0].endswith(
        ("Location", "Dir", "File"))]  # fmt: skip
    assert len(paths) == 6 and all(p.startswith("/f/") for p in paths), paths


@emulation
@installed
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
def test_srun_sbatch_squeue_scancel_on_the_nodes(cluster_cli):
    before = machine()
    cluster_cli.ok("up", "--nodes", "2", "--slurm")
    out = cluster_cli.ok("shell", "node0", "--", "sh", "-c", SRUN)
    assert where(out) == FOUR_ON_TWO, out
    for name, text in (("batch.sh", BATCH), ("long.sh", LONG)):
        with open(os.path.join(cluster_cli.tmp, name), "w") as f:
            f.write(text)
    script = ("sbatch -Q batch.sh && j=$(sbatch --parsable long.sh) && squeue -h -o '%i %j %T' "
              "&& scancel $j && echo CANCELLED $j")  # fmt: skip
    out = cluster_cli.ok("shell", "node0", "--", "sh", "-c", script)
    cancelled = out.split("CANCELLED ")[1].split()[0]
    assert f"{cancelled} long.sh" in out, out  # squeue listed it before scancel
    queue = _until_empty(cluster_cli)
    assert cancelled not in queue, queue
    with open(os.path.join(cluster_cli.tmp, "batch.out")) as f:
        assert where(f.read()) == FOUR_ON_TWO
    os.remove(os.path.join(cluster_cli.tmp, "batch.out"))
    for name in ("batch.sh", "long.sh"):
        os.remove(os.path.join(cluster_cli.tmp, name))
    keeper = keeper_of(cluster_cli.ok("status"))
    cluster_cli.ok("down")
    nothing_left(cluster_cli, keeper, before)


def _until_empty(cli, limit: float = 60) -> str:
    """squeue's jobs until none is left (the batch job ran, the long one was cancelled)."""
    end = time.monotonic() + limit
    while True:
        queue = cli.ok("shell", "node0", "--", "squeue", "-h", "-o", "%i %j %T")
        if not queue.strip() or time.monotonic() > end:
            return queue
        time.sleep(0.5)


@emulation
@installed
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
def test_the_cluster_check_under_srun(cluster_cli):
    """tests/ranks/cluster.py's cases (node facts, bytes on the cable against the ledger, the
    same bits as on one node) launched by `srun -N 2 --ntasks-per-node=2 --mpi=pmi2`."""
    suite = os.path.join(ROOT, "tests", "ranks", "cluster.py")
    cluster_cli.ok("up", "--nodes", "2", "--slurm")
    out = cluster_cli.ok("shell", "node0", "--", "srun", "-N", "2", "--ntasks-per-node=2",
                         PMI, sys.executable, "-m", "minipar.testing.worker", suite,
                         cluster_cli.tmp, timeout=300)  # fmt: skip
    ranks = {}
    for r in range(4):
        with open(os.path.join(cluster_cli.tmp, f"rank{r}.json")) as f:
            ranks[r] = json.load(f)
        os.remove(os.path.join(cluster_cli.tmp, f"rank{r}.json"))
        os.remove(os.path.join(cluster_cli.tmp, f"rank{r}.out"))
    names = ("facts", "link_bytes", "inside_node", "windows_stay_inside", "digest")
    for name in names:
        failed = {r: ranks[r][name] for r in ranks if not ranks[r].get(name, {}).get("ok")}
        assert not failed, f"{name}: {failed}\n{out[-3000:]}"
    cluster_cli.ok("down")
    alone = harness.run_suite(suite, 4, "mpi")  # the same suite on one node: the same bits
    alone.check("digest")
    digests = [ranks[0]["digest"]["output"], alone.ranks[0]["digest"]["output"]]
    assert digests[0].count("DIGEST") >= 15 and digests[0] == digests[1]


@emulation
@installed
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
def test_a_killed_keeper_takes_slurm_with_it(cluster_cli):
    before = machine()
    cluster_cli.ok("up", "--nodes", "2", "--slurm")
    keeper = keeper_of(cluster_cli.ok("status"))
    assert len(cluster_cli.processes()) >= 5  # the keeper, munged, slurmctld, two slurmd
    os.kill(keeper, signal.SIGKILL)
    time.sleep(0.2)
    status = cluster_cli("status")
    assert status.returncode == 1, status.stdout
    nothing_left(cluster_cli, keeper, before)


@emulation
@installed
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
def test_twenty_up_down_cycles_with_slurm_leave_nothing(cluster_cli):
    before = machine()
    for _ in range(20):
        cluster_cli.ok("up", "--nodes", "2", "--slurm")
        keeper = keeper_of(cluster_cli.ok("status"))
        cluster_cli.ok("down")
        nothing_left(cluster_cli, keeper, before)


@emulation
@installed
@pytest.mark.skipif(mpiexec.mpi_flavor() == "openmpi", reason="MPICH's PMI-1 under Slurm")
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
def test_a_pmi1_request_past_1024_bytes_is_cut(cluster_cli):
    """Slurm 22.05's pmi1.c reads a request with one read() of 1024 bytes. MPICH's PMI-1 put of
    a 511-byte piece is its key line plus up to 1022 characters: 1077 bytes here, cut, "value
    not properly terminated in client request" (the report of issue 69); 1024 bytes pass."""
    put = os.path.join(ROOT, "tests", "scripts", "pmi1_put.py")
    cluster_cli.ok("up", "--nodes", "2", "--slurm")
    ok = cluster_cli("shell", "node0", "--", "srun", "-n", "1", "--mpi=pmi2", sys.executable,
                     put, "1024")  # fmt: skip
    assert "PUT 1024 bytes: cmd=put_result rc=0" in ok.stdout, ok.stdout + ok.stderr
    assert "not properly terminated" not in ok.stderr, ok.stderr
    cut = cluster_cli("shell", "node0", "--", "srun", "-n", "1", "--mpi=pmi2", sys.executable,
                      put, "1077")  # fmt: skip
    assert "PUT 1077 bytes" in cut.stdout, cut.stdout + cut.stderr
    assert "mpi/pmi2: value not properly terminated in client request" in cut.stderr, cut.stderr
    cluster_cli.ok("down")


@emulation
@installed
@pytest.mark.skipif(mpiexec.mpi_flavor() == "openmpi", reason="the mpich wheel's PMI-1 under Slurm")
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
def test_the_wheel_under_srun_pmi2_runs_on_ofi_and_ends_with_status_0(cluster_cli):
    """Issue 69: `srun -N 2 --ntasks-per-node=2 --mpi=pmi2`, no netmod set by the user: minipar
    picks MPICH's OFI netmod before MPI_Init (rank 0 says so, once); a ring@shm all-reduce on
    each node's group (its windows left open at the end) sums 1 + 2 and 3 + 4, one across the
    nodes 1 + 2 + 3 + 4; and the job exits 0, MPI_Finalize's fabric close included."""
    cluster_cli.env.pop("MPIR_CVAR_CH4_NETMOD", None)
    cluster_cli.ok("up", "--nodes", "2", "--slurm")
    done = cluster_cli("shell", "node0", "--", "srun", "-N", "2", "--ntasks-per-node=2",
                       "--mpi=pmi2", sys.executable, SHM_AT_EXIT)  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    rows = sorted(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("SUMS"))
    assert rows == [[str(r), "3" if r < 2 else "7", "10", "ofi"] for r in range(4)], said[-3000:]
    assert said.count("Using MPICH's OFI module instead (MPIR_CVAR_CH4_NETMOD=ofi)") == 1, said
    assert "fabricclose" not in said, said[-3000:]
    cluster_cli.ok("down")
