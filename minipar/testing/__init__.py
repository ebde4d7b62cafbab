"""Multi-rank testing: run a suite of cases on N real ranks from an ordinary pytest.

A *suite* is a Python file that defines `cases(size) -> dict[name, function]`. The functions run
on every rank (with minipar initialised) and raise to fail. `harness.run_suite` launches the
suite once per (world size, transport) under mpiexec, or torch.multiprocessing.spawn with gloo,
and caches the per-rank results; each pytest test then checks one case. One launch runs many
cases, because starting ranks (and importing torch in each) costs seconds.
"""
