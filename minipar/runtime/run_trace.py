"""`minipar run --trace DIR`: every rank traces its whole run and writes its part at the end.

The launcher sets MINIPAR_TRACE_DIR for every rank. `init()` opens a trace on each rank (the
ledger records from then on: comm/trace/ledger.py) and measures the rank's clock offset to rank 0
while every rank is there (comm/chrome_trace.clock_offset: a few round trips, outside the
ledger); `finalize()`, or the interpreter's exit, closes it and writes DIR/rank{r}.json
(chrome_trace.part: this rank's records on its own clock). Once the job ended, `minipar run`
merges the parts into DIR/trace.json (chrome_trace.merge_folder). The open trace is this
process's state (minipar.state: run_trace).
"""

from __future__ import annotations

import atexit
import json
import os

from minipar.comm.trace import chrome_trace, ledger
from minipar.state import process

ENV = "MINIPAR_TRACE_DIR"


def start(world) -> None:
    """Open the run's trace if the launcher asked for one (collective over the world)."""
    folder = os.environ.get(ENV)
    if not folder or process.run_trace is not None:
        return
    trace = ledger.Trace()
    trace.clock = chrome_trace.clock_offset(world)
    process.traces.append(trace)
    process.run_trace = (trace, folder, world.global_ranks[world.rank])
    atexit.register(finish)


def finish() -> str | None:
    """Close the run's trace and write this rank's part; its path (None: no trace was open)."""
    if process.run_trace is None:
        return None
    trace, folder, rank = process.run_trace
    process.run_trace = None
    if trace in process.traces:
        process.traces.remove(trace)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank{rank}.json")
    with open(path, "w") as f:
        json.dump(chrome_trace.part(trace, rank), f)
    return path
