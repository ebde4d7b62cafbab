"""Every reliability case that runs on the MPI transport, in one launch per world size."""

import reliability
import reliability_concurrency
import reliability_mismatch
import reliability_timeouts

MODULES = [reliability, reliability_timeouts, reliability_mismatch, reliability_concurrency]


def cases(size):
    table = {}
    for module in MODULES:
        table.update(module.cases(size))
    return table
