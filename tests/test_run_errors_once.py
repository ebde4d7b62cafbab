"""`minipar run`: the same error raised alike on every rank is said once, in one line naming the
ranks (minipar/launcher/errors_once.py); hydra's lines about a lost proxy are dropped under a
supervisor, which explains the lost node itself."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

from minipar.launcher import errors_once, relay

RIGN = """\
import numpy as np
import minipar
minipar.init()
x = np.ones(4)
minipar.all_reduce(x, algorithm="rign")
"""


def _minipar_run(tmp_path, *argv):
    return subprocess.run(
        [sys.executable, "-m", "minipar", "run", *argv],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
        env=_env(),
    )


def _env():
    import os

    return dict(os.environ, PYTHONPATH=ROOT, MINIPAR_TIMEOUT="30")


@pytest.mark.own_job
@pytest.mark.timeout(120)
def test_a_misspelt_algorithm_on_two_ranks_is_one_line(tmp_path):
    """It was 40 lines: each rank's 15-line traceback, minipar's "aborting" line and MPI's
    abort line around one ValueError. Now one line: the ranks, where in the script, the
    error with its hint; then minipar's status line; a failing exit status."""
    (tmp_path / "rign.py").write_text(RIGN)
    done = _minipar_run(tmp_path, "-n", "2", "rign.py")
    said = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode != 0
    errors = [line for line in said if "ValueError" in line]
    assert len(errors) == 1, said
    first = errors[0]
    assert first.startswith("[rank 0, 1] rign.py line 5: ValueError: unknown all_reduce "
                            "algorithm 'rign' (did you mean 'ring'?)"), first  # fmt: skip
    assert first.index("(did you mean 'ring'?)") < 100
    assert not any("Traceback" in line or "MPI_Abort" in line for line in said), said
    assert len(said) <= 3, said


@pytest.mark.own_job
@pytest.mark.timeout(120)
def test_a_missing_script_on_four_ranks_is_said_once(tmp_path):
    done = _minipar_run(tmp_path, "-n", "4", "python", "nosuch.py")
    said = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode != 0
    errors = [line for line in said if "can't open file" in line]
    assert len(errors) == 1 and errors[0].startswith("[rank 0-3] python: can't open file"), said


def test_the_fold_keeps_one_ranks_traceback_whole_and_folds_alike_ones():
    """One rank's error: its lines as they were. Two ranks' alike: one line. Different ones:
    each its own. Other lines pass at once; MPI's abort line goes once minipar said it aborts."""
    fold = errors_once.Fold(3)

    def block(rank, message):
        return [
            f"[rank {rank}] Traceback (most recent call last):\n",
            f'[rank {rank}]   File "job.py", line 7, in <module>\n',
            f"[rank {rank}]     boom()\n",
            f"[rank {rank}] {message}\n",
            f"[rank {rank}] {errors_once.ABORTING}\n",
        ]

    out = []
    for rank, message in ((0, "KeyError: 'a'"), (1, "KeyError: 'a'"), (2, "OSError: disk")):
        for line in block(rank, message):
            out += fold.line(rank, line)
    assert out == []  # held, waiting for the others
    assert fold.line(2, "hello\n") == ["hello\n"]
    assert fold.line(0, "Abort(1) on node 0 (rank 0 in comm 0): application called x\n") == []
    chatter = ["[unset]: write_line error; fd=9 buf=:cmd=abort exitcode=1 message=abort\n", ":\n",
               "system msg for write_line failure : Broken pipe\n"]  # fmt: skip
    assert [out for line in chatter for out in fold.line(1, line)] == []
    ended = fold.end()
    assert "[rank 0, 1] job.py line 7: KeyError: 'a'\n" in ended
    assert block(2, "OSError: disk") == [line for line in ended if "rank 2" in line]
    assert errors_once.ranks_text([3, 0, 1, 2, 7, 5]) == "rank 0-3, 5, 7"


def test_a_message_of_several_lines_is_kept_whole():
    """A MismatchError's message goes on in indented lines (each rank's calls): the error is
    all of it, not its last indented line."""
    fold = errors_once.Fold(2)
    for rank in (0, 1):
        for line in [
            f"[rank {rank}] Traceback (most recent call last):",
            f'[rank {rank}]   File "job.py", line 3, in <module>',
            f"[rank {rank}]     minipar.all_reduce(x)",
            f"[rank {rank}]     ^^^^^^^^^^^^^^^^^^^^^",
            f"[rank {rank}] minipar.errors.MismatchError: the ranks' calls differ:",
            f"[rank {rank}]   rank 1: call #1 broadcast(src=0)",
            f"[rank {rank}] {errors_once.ABORTING}",
        ]:
            assert fold.line(rank, line + "\n") == []
    assert fold.end() == [
        "[rank 0, 1] job.py line 3: minipar.errors.MismatchError: the ranks' calls differ:\n",
        "  rank 1: call #1 broadcast(src=0)\n",
    ]


def test_hydras_lines_about_a_lost_proxy_are_matched():
    lines = [
        "[mpiexec@node0] control_cb (mpiexec/pmiserv_cb.c:351): assert (!closed) failed",
        "[mpiexec@node0] HYDT_dmxu_poll_wait_for_event (lib/tools/demux/demux_poll.c:76): "
        "callback returned error status",
        "[mpiexec@node0] HYD_pmci_wait_for_completion (mpiexec/pmiserv_pmci.c:173): error "
        "waiting for event",
        "[mpiexec@node0] main (mpiexec/mpiexec.c:260): process manager error waiting for "
        "completion",
    ]
    assert all(relay.HYDRA_PROXY_GONE.search(line) for line in lines)
    assert not relay.HYDRA_PROXY_GONE.search("[mpiexec@node0] some other complaint")


def test_a_supervised_jobs_relay_drops_hydras_lines_about_a_lost_proxy():
    """Under --max-restarts (run.py sets quiet_launcher) the relay drops them from mpiexec's
    own output; its other lines, and every line of an unsupervised job, pass."""
    import io

    lost = "[mpiexec@node0] control_cb (mpiexec/pmiserv_cb.c:351): assert (!closed) failed\n"
    other = "[mpiexec@node0] Press [Enter] to exit\n"
    for quiet, want in ((True, other), (False, lost + other)):
        err = io.StringIO()
        lines = relay.Relay(1, out=io.StringIO(), err=err)
        try:
            lines.quiet_launcher = quiet
            lines.readers[-1] = ("", "err")  # mpiexec's stderr, as pump() registers it
            lines.launcher_fds.add(-1)
            lines._emit(-1, (lost + other).encode())
        finally:
            del lines.readers[-1]
            lines.close()
        assert err.getvalue() == want
