"""torch.distributed parity: a program written for torch.distributed runs with
`import minipar as dist` (issue 18).

- parity.py: tutorial-style programs, each run with torch.distributed (gloo) and with minipar
  in the same job, equal results; on 2 and 3 ranks, over minipar's MPI transport (mpiexec) and
  its torch transport (spawn + gloo); plus bad input (docs/errors.md) and the list forms'
  algorithms;
- parity_setup.py: init_process_group / destroy_process_group as a torch program calls them.
"""

import os
import re

import pytest
from conftest import ROOT, ranks_suite

from minipar import launcher
from minipar.testing import harness
from minipar.testing.worker import load_suite

SUITE = ranks_suite("parity.py")
SETUP = ranks_suite("parity_setup.py")


@pytest.mark.parametrize("size,name", harness.params(SUITE, [2, 3]))
def test_parity_mpi(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


@pytest.mark.parametrize("size,name", harness.params(SUITE, [2, 3]))
def test_parity_torch_transport(size, name):
    harness.run_suite(SUITE, size, "torch").check(name)


@pytest.mark.own_job
def test_init_and_destroy_process_group():
    """ "mpi", then "gloo" brought up over MPI, then "gloo" with init_method / rank /
    world_size, each torn down by destroy_process_group, in one 2-rank job."""
    done = launcher.run(2, [SETUP], timeout=120, capture=True)
    assert done.returncode == 0 and done.stdout.count("setup ok") == 2, (
        done.stdout[-2000:] + done.stderr[-4000:]
    )


def test_errors_doc_lists_every_parity_case():
    """docs/errors.md's torch.distributed table has a row for every bad-input case, no other."""
    with open(os.path.join(ROOT, "docs", "errors.md")) as f:
        text = f.read()
    start = text.index("### Bad input of the torch.distributed calls")
    table = text[start : text.index("## Timeouts")]
    documented = set(re.findall(r"^\| `([a-z_0-9]+)`", table, flags=re.M))
    suite = load_suite(SUITE)
    cases = set(suite.BAD) | set(suite.UNPICKLABLE)
    assert documented == cases, (sorted(documented - cases), sorted(cases - documented))
