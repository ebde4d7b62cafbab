"""Ctrl-C on `minipar train` (minipar/cli/train_stop.py): every rank stops after the same step,
the run exits 130, and one minipar line names the steps done, the newest whole checkpoint and
the command that resumes; no launcher's "BAD TERMINATION" block. A Ctrl-C raises nothing while
steps run (it once landed in a destructor, was ignored, and the run went on to the end)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
from conftest import warm_python

from minipar.cli import train_stop


def test_a_ctrl_c_while_steps_run_raises_nothing_and_raises_the_flag():
    """Nothing to land in a destructor: the handler only sets the flag; a second Ctrl-C
    interrupts at once; the handler before is back after the block."""
    before = signal.getsignal(signal.SIGINT)
    with train_stop.StopFlag() as flag:
        assert not flag.up()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert flag.up()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.own_job
@pytest.mark.timeout(200)
@pytest.mark.parametrize("dp", [1, 2])
def test_ctrl_c_on_train_stops_and_says_how_to_resume(tmp_path, dp):
    """A real run of 400 steps, SIGINT once 8 steps are done (MINIPAR_PROGRESS counts them):
    one rank (the training in this process) or two (the launching process asks the ranks)."""
    progress, ck = tmp_path / "progress", tmp_path / "ck"
    argv = [*warm_python(["-m", "minipar"]), "train", "--dp", str(dp), "--steps", "400",
            "--checkpoint-every", "5", "--checkpoint-dir", str(ck), "--layers", "2",
            "--hidden", "32"]  # fmt: skip
    env = dict(os.environ, MINIPAR_PROGRESS=str(progress))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)  # fmt: skip
    try:
        start = time.monotonic()
        while time.monotonic() - start < 120 and proc.poll() is None:
            if progress.exists() and len(progress.read_text().splitlines()) >= 8:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out[-2000:] + err[-3000:]
    said = err.splitlines()
    first = next(line for line in said if "stopped by Ctrl-C" in line)
    assert len(first) <= 100, first
    done = int(re.search(r"after (\d+) of 400 steps; run the same command to resume", first)[1])
    assert 8 <= done < 400, first
    saved = next(line for line in said if "newest whole checkpoint" in line)
    step = int(re.search(r"step-(\d+) \((\d+) steps done\)", saved)[1])
    assert step == done - done % 5 and os.path.isdir(ck / f"step-{step:08d}"), saved
    resume = next(line for line in said if line.strip().startswith("resume: minipar train"))
    assert f"--checkpoint-dir {ck}" in resume and "--steps 400" in resume, resume
    assert "BAD TERMINATION" not in out + err and "Exception ignored" not in err, err[-3000:]
