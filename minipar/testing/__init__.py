"""Multi-rank testing: run a suite of cases on N real ranks from an ordinary pytest.

A *suite* is a Python file that defines `cases(size) -> dict[name, function]` (and may set
CASE_LIMIT, the seconds one case may run). The functions run on every rank (with minipar
initialised) and raise to fail. `harness.run_suite` runs a suite's cases once per (world size,
transport) and caches every rank's results; each pytest test then checks one case.

Starting ranks costs seconds (each imports torch), so the cases run on a warm pool: one job per
world size and transport (and launch environment) serves every suite of the pytest session,
and its ranks are forked from a process that imported torch once (zygote.py).

    harness.py    the pytest API: params, run_suite, check
    pool.py       the pytest side of the pool: jobs started on first use, cases sent in batches,
                  a hung or dead rank named and its job replaced, all closed at session end
    server.py     the rank side: a warm rank's loop over batches
    isolation.py  what a case may not leave for the next (minipar's process state reset; the
                  default group's calls, history and splits compared)
    groups.py     the groups a batch made, freed when it ends (their windows too)
    case.py       one case on one rank: its output captured, its traceback, its time
    wire.py       the messages between pytest and the ranks
    worker.py     one launch per suite instead (MINIPAR_TEST_POOL=0)
    spawn.py      N gloo ranks from one process (--backend torch), the rendezvous port held
    zygote.py     the fork server: each rank mpiexec starts is forked, warm, from one process
                  that has imported torch (the stand-in mpiexec starts passes it everything)
"""
