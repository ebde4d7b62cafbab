"""This machine, calibrated once: the numbers a lesson's "on this machine" prediction rests on.

    fit = fit_link(steps, nbytes, seconds)   # alpha, beta by least squares; alpha >= 0 or refused
    save(record); record = load()            # a per-user cache file (path() says where)
    link = calibrated_link(record, "mpi")    # a cost.Link; None if not measured or unphysical

`minipar calibrate` (minipar/bench/calibrate.py) measures, in about half a minute on 2 cores:

    links     alpha, beta per link class used: "mpi" (minipar's messages over MPI inside a
              node), "shm" (the shared-memory windows), "emulated" (the link between emulated
              nodes, at the job's rate, when run with --nodes), each a least-squares fit
    step_s    minipar's own Python cost per step of a collective (its 8-byte all-reduce per step,
              less a bare MPI message)
    gamma     seconds per byte reduced (numpy's add, every rank at once)
    copy_Bps  the memory-copy bandwidth, measured one way (cost.roofline.kernel_rates: numpy's
              copy of 32 MiB, every rank at once, the fastest run) and used by every lesson
    matmul_flops   the tiny GPT's matmul rate (its MLP's shape, float32, every rank at once)

with the host, the date, minipar's version, the cores and the load average while it ran, and
where it was made (provenance: the Python environment, minipar's folder; the file is one per
user, so `minipar doctor` says when it is another environment's or checkout's). A fit
whose intercept (alpha) comes out negative, or whose slope (beta) is not positive, is
unphysical: it is stored with `physical: false` and the reason, and never used.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from minipar.cost.link import Link

PATH_ENV = "MINIPAR_CALIBRATION"  # a file to use instead of the per-user cache


@dataclass(frozen=True)
class LinkFit:
    """alpha (s per message), beta (s per byte) fitted to `points` (steps, bytes, seconds)."""

    alpha: float
    beta: float
    physical: bool
    why: str = ""
    points: int = 0

    @property
    def bandwidth(self) -> float:
        return 1 / self.beta if self.beta > 0 else float("nan")


def fit_link(steps, nbytes, seconds) -> LinkFit:
    """Least squares for seconds = steps * alpha + nbytes * beta, on relative error (each row
    divided by its time, so 8 B and 8 MiB count alike although their times differ a
    thousandfold). Refused (physical=False) when alpha < 0 (a message cannot take negative
    time: the fit's intercept is noise, not a latency) or beta <= 0."""
    rows = [(float(k), float(n), float(t)) for k, n, t in zip(steps, nbytes, seconds)]
    if len(rows) < 2 or any(t <= 0 for *_, t in rows):
        return LinkFit(float("nan"), float("nan"), False, "fewer than 2 positive times", len(rows))
    # here, not at the top of the file: numpy loads only when used
    import numpy as np

    k, n, t = (np.array(col) for col in zip(*rows))
    a = np.column_stack([k / t, n / t / n.max()])  # columns scaled alike: a well-posed solve
    if np.linalg.matrix_rank(a) < 2:
        return LinkFit(float("nan"), float("nan"), False, "sizes too alike to fit", len(rows))
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    alpha, beta = float(alpha), float(beta / n.max())
    why = ""
    if alpha < 0:
        why = f"negative intercept (alpha = {alpha * 1e6:.3g} us): unphysical, not used"
    elif beta <= 0:
        why = f"slope beta = {beta:.3g} s/B is not positive: unphysical, not used"
    return LinkFit(alpha, beta, not why, why, len(rows))


def path() -> Path:
    """$MINIPAR_CALIBRATION, else $XDG_CACHE_HOME/minipar/calibration.json, else
    ~/.cache/minipar/calibration.json."""
    if os.environ.get(PATH_ENV):
        return Path(os.environ[PATH_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "minipar" / "calibration.json"


def provenance() -> dict:
    """Where a calibration is made: this Python's environment (sys.prefix) and the minipar it
    ran (the package's folder). The file is one per user, shared by every checkout and virtual
    environment, so `doctor` says whose it is (elsewhere)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {"python_prefix": sys.prefix, "minipar_path": package}


def elsewhere(record: dict) -> str:
    """Why `record` is not this environment's own ("" when it is): made by another virtual
    environment or minipar checkout, or by a minipar that did not record where."""
    mine = provenance()
    if "python_prefix" not in record:
        return f"made by minipar {record.get('minipar', '?')}, which did not record where"
    if (record["python_prefix"], record.get("minipar_path")) == tuple(mine.values()):
        return ""
    return (f"made from {record['python_prefix']} (minipar {record.get('minipar', '?')} at "
            f"{record.get('minipar_path', '?')})")  # fmt: skip


def save(record: dict, where: Path | None = None) -> Path:
    where = Path(where or path())
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = where.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(where)  # whole or absent
    return where


def load(where: Path | None = None) -> dict | None:
    """The stored calibration, or None (none yet, or unreadable)."""
    try:
        return json.loads(Path(where or path()).read_text())
    except (OSError, ValueError):
        return None


def link_record(fit: LinkFit, **extra) -> dict:
    return {**asdict(fit), **extra}


def calibrated_link(record: dict | None, name: str, gamma: float | None = None) -> Link | None:
    """The link class `name` ("mpi", "shm", "emulated") of a calibration as a cost.Link, or None
    when it was not measured or its fit was unphysical."""
    found = (record or {}).get("links", {}).get(name)
    if not found or not found.get("physical"):
        return None
    gamma = gamma if gamma is not None else record.get("gamma") or 1 / 5e9
    source = f"calibrated on {record.get('host', '?')}, {record.get('date', '?')}"
    return Link(f"this machine ({name})", found["alpha"], found["beta"], gamma, source)


def age_seconds(record: dict, now: float | None = None) -> float:
    return (now or time.time()) - float(record.get("time", 0))


def describe_age(seconds: float) -> str:
    for unit, scale in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= scale:
            return f"{seconds / scale:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


FRESH_SECONDS = 7 * 86400  # older, and the cost model goes back to its presets


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def unusable(record: dict | None, now: float | None = None) -> str:
    """Why the calibration `record` cannot price this machine's collectives ("" when it can):
    none stored, made with another core count, older than FRESH_SECONDS, or its MPI fit or step
    cost unphysical. Every rank decides alone (`auto` asks no peer), so the test reads nothing
    that differs between the ranks of one machine: not the hostname, which emulated nodes set
    apart (node0, node1) though they share the file and the cores."""
    if record is None:
        return "no calibration stored (run `minipar calibrate`)"
    if record.get("cores") != _cores():
        return f"made with {record.get('cores')} cores, this machine has {_cores()}"
    if age_seconds(record, now) >= FRESH_SECONDS:
        return f"stale: made {describe_age(age_seconds(record, now))}"
    mpi = (record.get("links") or {}).get("mpi") or {}
    if not mpi.get("physical"):
        return f"its MPI fit is unusable: {mpi.get('why') or 'not measured'}"
    step, gamma = record.get("step_s"), record.get("gamma")
    if not isinstance(step, (int, float)) or step < 0 or not step == step:
        return f"its per-step cost {step!r} is not a time"
    if gamma is not None and not (isinstance(gamma, (int, float)) and gamma > 0):
        return f"its reduction cost gamma = {gamma!r} is not positive"
    return ""


def step_link(record: dict) -> Link:
    """One step of minipar's collective on this machine, as `auto` prices it: the bare MPI
    message (alpha, beta) plus minipar's own Python per step (step_s), and gamma."""
    mpi = record["links"]["mpi"]
    gamma = record.get("gamma") or 1 / 5e9
    source = f"calibration of {record.get('date', '?')} on {record.get('host', '?')}"
    return Link("this machine", mpi["alpha"] + record["step_s"], mpi["beta"], gamma, source)


def here(where: Path | None = None) -> tuple[Link | None, str]:
    """(this machine's collective link from the stored calibration, "") when it is usable, else
    (None, why not)."""
    record = load(where)
    why = unusable(record)
    return (None, why) if why else (step_link(record), "")
