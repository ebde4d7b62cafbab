"""One launch per suite: runs a suite's cases on one rank and writes the results as JSON.

    python -m minipar.testing.worker SUITE.py OUTDIR [--backend mpi|torch] [--size N] [--only NAME]

What `harness.run_suite` launches with MINIPAR_TEST_POOL=0 (the warm pool's rank side is
testing/server.py). Each rank writes OUTDIR/rankR.json after every case, and its output goes to
OUTDIR/rankR.out (testing/case.py), which the harness reads for a rank that died. With --backend
torch it starts N processes with torch.multiprocessing.spawn, brings up a gloo process group in
each, and runs the same cases over minipar's torch.distributed transport.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import minipar
from minipar.testing import case, isolation, spawn


def load_suite(path: str):
    spec = importlib.util.spec_from_file_location(f"suite_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the suite's helpers import each other by name
    spec.loader.exec_module(module)
    return module


def run_cases(path: str, outdir: str, backend: str, only=None) -> None:
    comm = minipar.init(backend=backend)
    # the harness's own group: a case that times out can leave the world group's collectives
    # out of step, and the harness must still be able to compare notes after it
    control = comm.split(list(range(comm.size)), name="harness")
    cases = load_suite(path).cases(comm.size)
    results, out = {}, os.path.join(outdir, f"rank{comm.rank}.json")
    capture = case.Capture(os.path.join(outdir, f"rank{comm.rank}.out"))
    for name, fn in cases.items():
        if only and name not in only:
            continue
        results[name] = case.run(fn, capture)
        _realign(comm, control, results[name]["ok"])
        with open(out + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(out + ".tmp", out)
    control.barrier()  # nobody tears the transport down while others still use it
    minipar.finalize()


def _realign(comm, control, ok: bool) -> None:
    """After a case failed on some rank, put every rank's account of the default group (calls,
    their history, groups split: what tags and group ids carry) back in step, so that one
    failure does not make every later case time out (testing/isolation.py)."""
    control.timeout = 3 * comm.timeout + 5  # the others may still be waiting out a timeout
    seen = control.allgather_object((ok, isolation.account(comm)))
    accounts = [account for _, account in seen]
    if not all(flag for flag, _ in seen) and isolation.compare(accounts) is not None:
        isolation.realign(comm, max(accounts, key=lambda account: account["seq"]))


def _spawned(rank: int, path: str, outdir: str, only) -> None:
    run_cases(path, outdir, "torch", only)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("suite")
    parser.add_argument("outdir")
    parser.add_argument("--backend", default="mpi", choices=["mpi", "torch"])
    parser.add_argument("--size", type=int, default=1, help="ranks to spawn (torch backend)")
    parser.add_argument("--only", action="append")
    args = parser.parse_args(argv)
    if args.backend == "mpi":
        run_cases(args.suite, args.outdir, "mpi", args.only)
        return
    spawn.spawn(_spawned, (args.suite, args.outdir, args.only), args.size)


if __name__ == "__main__":
    main()
