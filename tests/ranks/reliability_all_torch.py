"""Every reliability case that runs on the torch transport, in one launch (starting ranks that
import torch is the expensive part). Count mismatches are left out: gloo aborts the process on a
message of the wrong size (tests/faults covers that)."""

import reliability
import reliability_concurrency
import reliability_timeouts

MODULES = [reliability, reliability_timeouts, reliability_concurrency]


def cases(size):
    table = {}
    for module in MODULES:
        table.update(module.cases(size))
    return table
