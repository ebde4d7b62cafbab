"""One strategy bench's job: launch `python -m module OUT ...` on some ranks (on emulated nodes
with `--nodes`: bench ddp, fsdp), read the JSON its rank 0 wrote to OUT, and leave no folder
behind (bench ddp, fsdp, cp, moe)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from minipar import launcher
from minipar.launcher.cluster import link
from minipar.launcher.cluster.job import emulated


def run_json(ranks: int, module: str, args: list, timeout, what: str, nodes=None, rate=None):
    """The job's JSON, or None with its failure printed (`minipar bench {what}`). With `nodes`:
    on that many emulated nodes joined at `rate` (default link.DEFAULT), made for this job."""
    if nodes is None:
        return _run_json(ranks, module, args, timeout, what, None)
    with emulated(nodes, rate or link.DEFAULT) as cluster:
        return _run_json(ranks, module, args, timeout, what, cluster)


def _run_json(ranks: int, module: str, args: list, timeout, what: str, cluster):
    folder = tempfile.mkdtemp(prefix=f"minipar-bench-{what}-")
    out = os.path.join(folder, "result.json")
    try:
        done = launcher.run(ranks, ["-m", module, out, *map(str, args)], timeout=timeout,
                            capture=True, cluster=cluster)  # fmt: skip
        if done.returncode != 0 or not os.path.exists(out):
            # here, not at the top of the file: rich loads only when used
            from minipar.term import Console

            tail = (done.stderr or "")[-4000:]
            Console().print(f"[red]minipar bench {what}: the job failed[/]\n{tail}")
            return None
        with open(out) as f:
            return json.load(f)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
