"""Every reliability case that runs on the MPI transport, in one launch per world size; the
mismatch cases that mostly wait (reliability_mismatch.WAITING) run in their own suite only."""

import reliability
import reliability_concurrency
import reliability_mismatch
import reliability_timeouts

MODULES = [reliability, reliability_timeouts, reliability_mismatch, reliability_concurrency]


def cases(size):
    table = {}
    for module in MODULES:
        table.update(module.cases(size))
    return {name: case for name, case in table.items() if name not in reliability_mismatch.WAITING}
