"""Ctrl-C on `minipar train`: every rank stops after the same step, and one line says where.

    minipar train: stopped by Ctrl-C after 37 of 400 steps; run the same command to resume
      newest whole checkpoint: ck/step-00000035 (35 steps done)
      resume: minipar train --dp 2 --steps 400 --checkpoint-every 5 --checkpoint-dir ck

The ranks' SIGINT handler only sets a flag (StopFlag): nothing is raised inside whatever runs,
so a Ctrl-C can no longer land in a destructor, be printed as "Exception ignored ...
KeyboardInterrupt" and leave the run going. The flag is read once a step, in the step's small
message every rank already sends (train.Reporter.step), so every rank stops after the same
step. The launching `minipar train` is not in the ranks' process group (their own session), so
on Ctrl-C it creates the job's stop file (STOP_ENV) that the flag also reads, waits for the
ranks to stop (GRACE s; a second Ctrl-C does not wait) and returns 130, with no launcher's
"BAD TERMINATION" block: the ranks end cleanly. The flag is set only while steps run: a Ctrl-C
before the first step or after the last interrupts at once.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from minipar.launcher import stop
from minipar.models import checkpoint_files as files

STOP_ENV = "MINIPAR_TRAIN_STOP"  # a file: once it exists, the ranks stop after the step
COMMAND_ENV = "MINIPAR_TRAIN_COMMAND"  # the user's command line, for the resume line
GRACE = 30.0  # s the launching process waits for the ranks to stop after a Ctrl-C


class Stopped(Exception):
    """Raised on every rank after the same step once any rank's StopFlag is up."""

    def __init__(self, done: int):
        super().__init__(f"stopped after {done} steps")
        self.done = done


class StopFlag:
    """Up once SIGINT arrives (a second one interrupts at once) or the job's stop file exists;
    `with StopFlag() as flag:` installs the handler for the block (main thread only)."""

    def __init__(self):
        self.signum = None
        self.path = os.environ.get(STOP_ENV)
        self.previous = None

    def __enter__(self):
        try:
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # ignored: kept so
                self.previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread: only the stop file is read
            self.previous = None
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def _handler(self, signum, frame):
        self.signum = signum
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C: at once

    def up(self) -> bool:
        return self.signum is not None or bool(self.path and os.path.exists(self.path))


def command(argv=None) -> str:
    """The command that started this run, as the user typed it (`minipar train ...`)."""
    said = os.environ.get(COMMAND_ENV)
    if said:
        return said
    argv = sys.argv[1:] if argv is None else argv
    words = argv if argv[:1] == ["train"] else ["train", *argv]
    return "minipar " + shlex.join(words)


def lines(root, done, total: int) -> list[str]:
    """What rank 0 (or the launching process, done None: step unknown) says after a stop."""
    reached = f"after {done} of {total} steps" if done is not None else "before a step's end"
    if not root:
        return [
            f"minipar train: stopped by Ctrl-C {reached}; nothing saved to resume from "
            "(--checkpoint-dir DIR --checkpoint-every K saves it)"
        ]
    folder, manifest, _ = files.newest_whole(root)
    if folder is None:
        return [
            f"minipar train: stopped by Ctrl-C {reached}; no whole checkpoint in {root} yet: "
            "the same command starts over",
            f"  command: {command()}",
        ]
    return [
        f"minipar train: stopped by Ctrl-C {reached}; run the same command to resume",
        f"  newest whole checkpoint: {folder} ({manifest.get('step')} steps done)",
        f"  resume: {command()}",
    ]


def say(root, done, total: int) -> None:
    print("\n".join(lines(root, done, total)), file=sys.stderr, flush=True)


def launch(cmd: list[str], env: dict, timeout, root, total: int) -> int:
    """Run the ranks (their own session); Ctrl-C asks them to stop after the step and waits
    GRACE s, then stops the job. The job's status; 130 after a Ctrl-C, 124 after `timeout`."""
    folder = tempfile.mkdtemp(prefix="minipar-train-")
    env = dict(env, **{STOP_ENV: os.path.join(folder, "stop"), COMMAND_ENV: command()})
    began = time.time()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop.stop(proc)
            print(f"minipar: job killed after {timeout:g} s (timeout)", file=sys.stderr)
            return 124
        except KeyboardInterrupt:
            open(env[STOP_ENV], "w").close()
        try:
            proc.wait(GRACE)  # the ranks stop after the step; rank 0 says where
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            stop.stop(proc)
            say(root, None, total)
        return 130
    finally:
        stop.signal_pid(-proc.pid, signal.SIGKILL)  # no rank outlives the job
        if proc.returncode != 0:
            stop.remove_hydra_leftovers(began)
        shutil.rmtree(folder, ignore_errors=True)
