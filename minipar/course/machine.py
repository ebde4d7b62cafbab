"""This machine as the lessons predict it: the calibration (`minipar calibrate`), or, where there
is none, the same measurements made at the start of the lesson, and said so.

    m = this_machine(page.comm)      # collective: every rank calls it
    m.message                        # minipar's message inside a node (message latency, beta)
    m.bare_s                         # a bare MPI message (mpi4py): what MPI's own steps pay
    m.collective                     # a collective's step: the message plus minipar's Python
    m.copy_Bps                       # THE memory-copy bandwidth (bench.calibrate.copy_rates)
    m.basis                          # "calibrated on HOST, DATE" or "measured at the start ..."

Predictions about real clusters keep the presets (cost.NVLINK5, cost.IB_NDR, ...) and say so;
only "this machine" reads from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from minipar import cost
from minipar.bench import calibrate as measuring
from minipar.cost import calibration

# the link measured at a lesson's start, where there is no calibration: 8 B for the latency, 4 MiB
# for beta (a ring's message of lesson 04's 8 MiB on 2 ranks: MPI's large-message protocol, the
# one the lessons' big messages take, not the eager one of 1 MiB and below)
QUICK_SIZES = [8, 64 << 10, 4 << 20]


@dataclass(frozen=True)
class Machine:
    message: cost.Link  # one message between two ranks of this node, minipar's transport
    collective: cost.Link  # one step of a collective: the message + minipar's own Python
    step_s: float  # minipar's Python per step
    copy_Bps: float  # memory copy, every rank at once, measured now the one way
    add_Bps: float
    basis: str
    emulated: cost.Link | None = None  # the link between emulated nodes, if calibrated
    bare_s: float = 0.0  # a bare MPI message (mpi4py, no minipar): what MPI's own steps pay


def _stored(comm) -> dict | None:
    """Rank 0's calibration, if it is this machine's and fresh; the same on every rank."""
    record = calibration.load() if comm.rank == 0 else None
    fresh = record is not None and not calibration.unusable(record)  # the cost model's rule
    return comm.allgather_object(record if fresh else None)[0]


def this_machine(comm, copy_bytes: int = measuring.COPY_BYTES) -> Machine:
    """The machine's links and rates (collective). The memory rates are always measured now
    (they move most with the load); the links come from the calibration when there is one."""
    copy, add = measuring.copy_rates(comm, copy_bytes)
    record = _stored(comm)
    if record is not None:
        message = calibration.calibrated_link(record, "mpi", 1 / add)
        step, bare = record["step_s"], record.get("bare_message_s") or message.alpha
        load = max(record["load"]["before"], record["load"]["during"])
        busy = f", under load {load:.1f}" if load > record["cores"] else ""
        basis = f"calibrated on {record['host']}, {record['date']}{busy} (minipar calibrate)"
        emulated = calibration.calibrated_link(record, "emulated", 1 / add)
        rate = os.environ.get(measuring.LINK_ENV)
        link_rate = (record["links"].get("emulated") or {}).get("rate_bits")
        if emulated is not None and (not rate or float(rate) != link_rate):
            emulated = None  # measured at another rate than this job's
    else:
        peer = measuring.peers(comm)[0]
        alpha, beta = cost.default_link().alpha, cost.default_link().beta
        if peer is not None:  # message latency: the 8 B time itself, not a fit's intercept
            _, times = measuring.link_sweep(comm, 0, peer, QUICK_SIZES)
            beta = (times[-1] - times[0]) / (QUICK_SIZES[-1] - QUICK_SIZES[0])
            alpha = times[0] - QUICK_SIZES[0] * beta
        message = cost.Link("this machine (mpi)", alpha, beta, 1 / add, "measured now")
        step, bare = measuring.step_cost(comm) if peer == 1 else (0.0, alpha)
        basis = "measured at the start of this lesson (no calibration: `minipar calibrate`)"
        emulated = None
    collective = cost.Link(
        "this machine (collective step)", message.alpha + step, message.beta, 1 / add, basis
    )
    return Machine(message, collective, step, copy, add, basis, emulated, bare)


def link_bits() -> float | None:
    """The emulated link's rate in bits/s this job runs on (`--nodes`), or None."""
    rate = os.environ.get(measuring.LINK_ENV)
    return float(rate) if rate else None
