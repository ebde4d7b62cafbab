"""Two lanes for pytest-xdist's two workers (conftest's WORKERS, the whole suite): the files that
mostly wait run on one worker, every other file on the other, each lane in collection order.

On two cores, two multi-rank jobs at once cost more than one after the other (16 oversubscribed
ranks pass each message far slower than 8: the 8-rank GPT meshes took 277 s beside another
job, 55 s alone), so the busy files keep one worker to themselves. But about a third of a
serial run's core-seconds are idle: cases that wait out a timeout or a hung rank on purpose,
small jobs that sleep between messages. The WAITING files (measured: both cores at most ~2/3
busy while they run) fill those gaps beside the busy lane instead of after it.

Each worker has its own warm pool of jobs (minipar.testing.pool), started from its own fork
server, so the lanes share no job. `pytest -n 0` runs everything in one process, in order;
`--lanes=off` gives xdist's own load scheduling back.

The lanes should take about as long: once the ranks' collections stopped walking torch's
objects (zygote._freeze) the busy lane shrank to 243 test-seconds against the waiting lane's
292, so test_pipeline and test_layers (12 s each, mostly busy) moved to the busy lane; with the
grader's wall (test_grade_wall, 25 s) in the waiting lane, test_cli (13 s) moved to the busy one
(297 against 267 test-seconds before it, in one quiet run).
"""

from __future__ import annotations

import os

WAITING = {  # file -> why it waits
    "test_reliability.py": "timeouts and mismatches found by waiting (0.25-1.2 s each)",
    "test_harness.py": "the pool's self-tests: hung cases, killed jobs, their limits",
    "test_grading.py": "planted mistakes that time out",
    "test_grade.py": "the grader's own pytest and pool",
    "test_grade_wall.py": "graders in processes of their own, a rank that spins until its limit",
    "test_train_interrupt.py": "train runs stopped by Ctrl-C, waiting for the ranks to stop",
    "test_soak.py": "mismatches asked after 0.3 s",
    "test_shm.py": "window waits on 2-4 ranks",
    "test_mpisetup.py": "doctor's and init's refusals",
    "test_units.py": "",
    "test_cost.py": "",
    "test_models.py": "",
    "test_recompute.py": "",
    "test_cuda.py": "skipped without a GPU",
    "test_faults.py": "jobs that end by timing out or asking a stalled peer (3 s limits)",
    "test_strategy_faults.py": "strategies' jobs that time out on a planted fault",
    "test_torchrun.py": "torchrun's rendezvous and start-up",
    "test_launcher.py": "launcher start-ups, jobs that fail on purpose",
    "test_cluster.py": "emulated nodes: jobs stopped on purpose, a pulled cable's timeout",
    "test_cluster_rootless.py": "emulated nodes (one lane: their namespaces counted)",
    "test_cluster_standing.py": "emulated nodes (one lane: their namespaces counted)",
    "test_cluster_slurm.py": "emulated nodes (one lane: their namespaces counted)",
}
BUSY, WAITS = "busy", "waiting"


def lane(nodeid: str) -> str:
    """The lane of a test, from its file's name."""
    return WAITS if os.path.basename(nodeid.split("::", 1)[0]) in WAITING else BUSY


def scheduler(config, log):
    """xdist's scheduling by scope, the scope being the lane: each worker gets one lane whole
    (a third worker would get nothing and stop)."""
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane(nodeid)

    return LaneScheduling(config, log)
