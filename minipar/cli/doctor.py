"""`minipar doctor`: is this machine ready to run minipar, and what will it run on?

It looks at the MPI library mpi4py loads (version, flavor, the mpiexec that belongs to it), at
torch (version, gloo and NCCL, CUDA devices) and at the cores, then launches a 2-rank smoke job
(minipar.course.demos.smoke) that sends a message around a ring and all-reduces a vector.
Questions only an initialised MPI answers (thread level, CUDA-aware transfers) are asked inside
that job, so the doctor's own process never calls MPI_Init. Exit 0 when minipar can run.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict, dataclass

from minipar import launcher
from minipar.cli import calibrate
from minipar.comm.setup import mpisetup
from minipar.cost import calibration
from minipar.errors import MPISetupError
from minipar.launcher.cluster import leftovers, needs

EXAMPLES = """\
examples:
  minipar doctor                  the table, then a 2-rank smoke job
  minipar doctor --json           the same as JSON (for scripts and bug reports)
  minipar doctor --no-smoke       only look, launch nothing (ask MPI in a 1-rank job)

Exit status 0 when minipar can run here: mpi4py imports, an mpiexec is found, and the smoke
job's ranks exchanged messages and agreed on an all-reduce.
"""


@dataclass
class Check:
    name: str
    value: str
    status: str = "ok"  # "ok", "warn" (works, but read the note) or "fail" (minipar cannot run)
    note: str = ""


def mpi_checks() -> list[Check]:
    """The MPI library mpi4py loads, the mpiexec that belongs to it, without initialising MPI."""
    try:
        import mpi4py
    except ImportError as error:
        return [Check("mpi4py", "not importable", "fail", f"{error}; pip install mpi4py mpich")]
    try:
        lib = mpisetup.library()
    except MPISetupError as error:
        return [
            Check("mpi4py", mpi4py.__version__),
            Check("MPI library", "none found", "fail", str(error)),
        ]
    MPI = mpisetup.load_mpi()
    checks = [
        Check("mpi4py", mpi4py.__version__),
        Check("MPI library", f"{lib['vendor']} {lib['version']}", note=lib["text"]),
        Check("libmpi loaded", lib["path"] or "unknown", note="the file mpi4py opened"),
        Check("MPI flavor", lib["flavor"]),
        Check("MPI standard", "{}.{}".format(*MPI.Get_version())),
    ]
    checks += mpiexec_checks(lib)
    if lib["flavor"] == "openmpi" and launcher.is_root():
        checks.append(Check("Open MPI as root", "allowed", note=(
            "running as root: minipar sets OMPI_ALLOW_RUN_AS_ROOT=1 and "
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 when it launches Open MPI (a bare mpiexec needs "
            "them, or --allow-run-as-root)")))  # fmt: skip
    if "SLURM_JOB_ID" in os.environ:
        checks.append(Check("Slurm", f"use {mpisetup.srun_hint(lib)}", note=(
            "`srun --mpi=list` shows what this Slurm offers; with the wrong one each task is a "
            "world of one, and minipar.init() stops with an error")))  # fmt: skip
    return checks


def mpiexec_checks(lib: dict) -> list[Check]:
    """The mpiexec minipar uses, and the one first on PATH: a bare `mpiexec` from another MPI
    starts n worlds of one (or aborts), so a mismatch is a warning."""
    try:
        used = launcher.find_mpiexec()
    except FileNotFoundError as error:
        return [Check("mpiexec", "not found", "fail", str(error))]
    checks = [Check("mpiexec", used, note="what minipar run uses")]
    on_path = mpisetup.mpiexec_on_path()
    if on_path is None:
        checks.append(Check("mpiexec on PATH", "none", note="minipar run finds its own"))
        return checks
    theirs = mpisetup.launcher_flavor(on_path)
    same = mpisetup.same_file(on_path, lib["mpiexec"] or used)
    if same or theirs == lib["flavor"]:
        checks.append(Check("mpiexec on PATH", on_path, note=f"{theirs}: matches the library"))
    else:
        checks.append(Check("mpiexec on PATH", on_path, "warn", (
            f"{theirs or 'unknown'} launcher, but mpi4py loaded {lib['vendor']}: a bare "
            f"`mpiexec -n 4 python ...` would start 4 worlds of one or abort; use `minipar "
            f"run`, or {mpisetup.matching_mpiexec(lib)}")))  # fmt: skip
    return checks


def torch_checks() -> list[Check]:
    """torch, its distributed backends, and the CUDA devices it sees."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        note = f"{error}: numpy buffers only; pip install torch"
        return [Check("torch", "not installed", "warn", note)]
    checks = [Check("torch", torch.__version__)]
    if not dist.is_available():
        return checks + [Check("torch.distributed", "not built in", "warn")]
    yes = {True: "available", False: "not available"}
    checks.append(Check("gloo", yes[dist.is_gloo_available()]))
    gpus = torch.cuda.is_available()
    checks.append(nccl_check(dist.is_nccl_available(), gpus))
    if gpus:
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        summary = f"{len(names)} x {names[0]}" if len(set(names)) == 1 else ", ".join(names)
        checks.append(Check("CUDA devices", summary, note=f"CUDA {torch.version.cuda}"))
    else:
        built = f"torch built for CUDA {torch.version.cuda}, " if torch.version.cuda else ""
        checks.append(Check("CUDA devices", "none", note=f"{built}CPU tensors only"))
    return checks


def nccl_check(built: bool, gpus: bool) -> Check:
    """NCCL as it is here: built into torch is not usable without a CUDA device."""
    if not built:
        return Check("nccl", "not available", note="not in this torch build: gloo is the backend")
    if not gpus:
        return Check("nccl", "built in, unusable here", note="NCCL needs a CUDA device per "
                     "rank and there is none: gloo is the backend here")  # fmt: skip
    return Check("nccl", "available")


def machine_checks() -> list[Check]:
    n = launcher.cores()
    note = f"jobs of more than {n} ranks run oversubscribed (waits yield the core)"
    return [
        Check("python", f"{platform.python_version()} ({platform.machine()})"),
        Check("cores", str(n), note=note),
    ]


def calibration_checks() -> list[Check]:
    """The stored calibration (`minipar calibrate`) the lessons' "this machine" predictions use,
    and its age; a warning when there is none or it is older than a month."""
    record = calibration.load()
    if record is None:
        return [Check("calibration", "none", "warn", "run `minipar calibrate` (half a minute): "
                      "the lessons predict this machine from it")]  # fmt: skip
    old = calibration.age_seconds(record) > 30 * 86400
    load = record.get("load", {})
    busy = max(load.get("before", 0), load.get("during", 0)) > record.get("cores", 1)
    other = calibration.elsewhere(record)  # one file per user: maybe another venv's
    note = ("older than a month: run `minipar calibrate` again" if old else
            "measured on a busy machine: run `minipar calibrate` again when it is quiet"
            if busy else f"not this environment's: run `minipar calibrate` to make its own; "
            f"{other}" if other else str(calibration.path()))  # fmt: skip
    lines = calibrate.rows(record)
    warn = old or busy or other
    return [Check("calibration", lines[0][1], "warn" if warn else "ok", note)] + [
        Check(f"  {name}", value) for name, value in lines[1:]
    ]  # fmt: skip


def smoke_checks(ranks: int = 2, timeout: float = 60) -> list[Check]:
    """Launch the smoke job and turn what its rank 0 printed into checks."""
    # here, not at the top of the file: numpy loads only when used
    from minipar.course.demos.smoke import PREFIX

    try:
        smoke = ["-m", "minipar.course.demos.smoke"]
        done = launcher.run(ranks, smoke, timeout=timeout, capture=True)
    except (FileNotFoundError, ValueError) as error:
        return [Check(f"{ranks}-rank smoke job", "not started", "fail", str(error))]
    lines = [ln for ln in (done.stdout or "").splitlines() if ln.startswith(PREFIX)]
    if done.returncode != 0 or not lines:
        tail = " | ".join((done.stderr or done.stdout or "").strip().splitlines()[-3:])
        return [Check(f"{ranks}-rank smoke job", f"exit {done.returncode}", "fail", tail)]
    facts = json.loads(lines[-1][len(PREFIX) :])
    agreed = facts["ring_ok"] and facts["all_reduce_ok"]
    checks = [
        Check("thread level", facts["thread_level"]),
        Check(
            "CUDA-aware MPI", "yes" if facts["cuda_aware"] else "no", note=facts["cuda_aware_why"]
        ),
    ]
    if "transport" in facts:
        good = facts.get("shm_ok", True)
        note = '`MINIPAR_TRANSPORT=mpi|shm|auto`; `algorithm="ring@shm"` forces one call'
        if facts.get("shm_used"):
            note = "an all-reduce over the shared windows agreed; " + note
        checks.append(Check("transport", facts["transport"], "ok" if good else "fail", note))
    checks += device_checks(facts) + node_checks(facts)
    if ranks > 1:
        what = f"ring shift + all-reduce in {facts['seconds']:.2f} s"
        checks.append(Check(f"{ranks}-rank smoke job", "passed" if agreed else "wrong results",
                            "ok" if agreed else "fail", what))  # fmt: skip
    return checks


def node_checks(facts: dict) -> list[Check]:
    """Which node each smoke-job rank runs on (runtime/nodes.py: the node map every rank knows)."""
    if "nodes" not in facts:
        return []
    names, node_of = facts["nodes"], facts["node_of"]
    value = f"{len(names)} ({', '.join(names)})"
    where = ", ".join(f"rank {r} -> {names[n]}" for r, n in enumerate(node_of))
    return [Check("nodes", value, note=f"{where}; from {facts['nodes_from']}")]


def emulation_checks() -> list[Check]:
    """Can `minipar run --nodes` emulate nodes here, and what dead jobs left (removed now)."""
    lacks = needs.missing()
    if lacks:
        return [Check("emulated nodes", "not available", "warn",
                      "; ".join(lacks) + " (minipar run without --nodes works)")]  # fmt: skip
    removed = leftovers.sweep()
    note = "minipar run --nodes 2 -n 4 script.py (docs/cluster.md)"
    if removed:
        more = f" and {len(removed) - 5} more" if len(removed) > 5 else ""
        shown = ", ".join(removed[:5]) + more
        note = f"removed what dead jobs left ({len(removed)}): {shown}; " + note
    how = "root" if os.geteuid() == 0 else "without root: user namespaces"
    return [Check("emulated nodes", f"available ({how}, ip, tc, nsenter, unshare)", note=note)]


def device_checks(facts: dict) -> list[Check]:
    """Which device each smoke-job rank would compute on (minipar.device()), and whether ranks
    share a GPU (allowed: they take turns on it; NCCL would refuse, minipar does not)."""
    if "local_ranks" not in facts:
        return []
    # here, not at the top of the file: numpy loads only when used
    from minipar.runtime import devices

    torch = sys.modules.get("torch")
    gpus = torch.cuda.device_count() if torch is not None and torch.cuda.is_available() else 0
    local = facts["local_ranks"]
    where = ["cpu" if gpus == 0 else f"cuda:{devices.pick_index(lr, gpus)}" for lr in local]
    value = ", ".join(f"rank {r} -> {d}" for r, d in enumerate(where))
    note = f"local rank from {facts['local_rank_from']}"
    shared = max((where.count(d) for d in set(where)), default=0)
    if gpus and shared > 1:
        note += (f"; {shared} ranks share a GPU (allowed: they take turns on it; "
                 "torch.distributed's NCCL would refuse, use gloo as the reference)")  # fmt: skip
    return [Check("rank devices", value, note=note)]


def path_checks(checks: list[Check]) -> list[Check]:
    """How CUDA tensors will cross MPI: direct, or staged (pipelined above one chunk); with no
    CUDA device, that there is none, and what would happen on one."""
    aware = next((c for c in checks if c.name == "CUDA-aware MPI"), None)
    if aware is None:
        return []
    found = _cuda_path(aware)
    cuda = next((c for c in checks if c.name == "CUDA devices"), None)
    if cuda is not None and cuda.value != "none":
        return found
    return [Check("CUDA tensor path", "none here (no CUDA device)",
                  note=f"on a GPU: {c.value}; {c.note}") for c in found]  # fmt: skip


def _cuda_path(aware: Check) -> list[Check]:
    # here, not at the top of the file: numpy loads only when used
    from minipar.comm.transport import staging

    if aware.value == "yes":
        return [Check("CUDA tensor path", "direct", note="device buffers go straight to MPI, "
                      "after the current stream is synchronised")]  # fmt: skip
    try:
        chunk = staging.chunk_bytes()
    except ValueError as error:
        return [Check("CUDA tensor path", "bad MINIPAR_STAGE_CHUNK", "fail", str(error))]
    if chunk == 0:
        return [Check("CUDA tensor path", "staged", note="one pinned-host copy each way "
                      "(MINIPAR_STAGE_CHUNK=0: pipelining off)")]  # fmt: skip
    return [Check("CUDA tensor path", f"staged, pipelined above {chunk >> 10} KiB",
                  note="pinned host buffers; large messages cross in chunks with the copies "
                  "overlapped (MINIPAR_STAGE_CHUNK sets the chunk)")]  # fmt: skip


def collect(smoke: bool = True, timeout: float = 60) -> dict:
    """Every check, and whether minipar can run ("ok": no check failed)."""
    checks = mpi_checks()
    mpi_ok = all(c.status != "fail" for c in checks)
    checks += torch_checks() + machine_checks() + emulation_checks() + calibration_checks()
    if mpi_ok:
        checks += smoke_checks(2 if smoke else 1, timeout)
    checks += path_checks(checks)
    cuda = next((c for c in checks if c.name == "CUDA devices"), None)
    aware = next((c for c in checks if c.name == "CUDA-aware MPI"), None)
    if cuda and aware and cuda.value != "none" and aware.value == "no":
        aware.status = "warn"
        aware.note += "; CUDA tensors are staged through pinned host memory"
    return {"ok": all(c.status != "fail" for c in checks), "checks": [asdict(c) for c in checks]}


MARKS = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]"}


def table(report: dict, title: str = "minipar doctor", notes: bool = True):
    from rich.table import Table

    grid = Table(title=title, title_justify="left")
    grid.add_column("check", style="bold")
    grid.add_column("value", overflow="fold")
    grid.add_column("", no_wrap=True)
    if notes:
        grid.add_column("note", style="dim", overflow="fold")
    for c in report["checks"]:
        row = [c["name"], c["value"], MARKS[c["status"]]] + ([c["note"]] if notes else [])
        grid.add_row(*row)
    return grid


def verdict(report: dict) -> str:
    if report["ok"]:
        return "[bold green]minipar can run here.[/]"
    failed = ", ".join(c["name"] for c in report["checks"] if c["status"] == "fail")
    return f"[bold red]minipar cannot run here yet:[/] fix {failed} (see the notes above)."


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--no-smoke", action="store_true",
                        help="no 2-rank smoke job (only a 1-rank probe)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=60, metavar="S",
                        help="seconds the smoke job may take (default 60)")  # fmt: skip


def main(args) -> int:
    report = collect(smoke=not args.no_smoke, timeout=args.timeout)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        # here, not at the top of the file: rich loads only when used
        from minipar.term import Console

        console = Console(highlight=False)
        console.print(table(report))
        console.print(verdict(report))
    return 0 if report["ok"] else 1
