"""However `minipar grade` ends, nothing of it stays (issue 69: a class grading on one server).

SIGTERM (a course platform's time limit) and SIGHUP stop a grade as Ctrl-C does: its clean-ups
run, and its TMPDIR is left as it was found, with no student's process running on. A SIGKILL
runs nothing: the student's process dies with the grader (PR_SET_PDEATHSIG) and the folders it
left carry its pid (launcher/own_folder.py), so the next grade removes them. The grades here
stop while a student's function loops for ever (a planted spin), so each ending comes while
the grade is surely running. The long check does the same while a job of ranks runs, and looks
at /dev/shm.

Found by scripts/grade_users.py: a run kept with --keep (its users' TMPDIRs too) showed, as
left by its first round, the folders of the grades an earlier, interrupted run had SIGKILLed
(docs/records/2026-12-07-grade-users.txt).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from minipar import exercises
from minipar.launcher import shm_leftovers

pytestmark = pytest.mark.slow  # CI's long checks only (MINIPAR_EXTENDED=1)

SOLUTIONS = exercises.tree("solutions")
LONG = pytest.mark.skipif(
    os.environ.get("MINIPAR_EXTENDED") != "1", reason="MINIPAR_EXTENDED=1 (CI's long checks)"
)
# ex12's mtbi_seconds loops for ever: per_gpu only grows (to inf, still > 0)
SPIN = ("    return per_gpu / gpus\n",
        "    while per_gpu > 0:\n        per_gpu += 1.0\n    return per_gpu / gpus\n")  # fmt: skip
# ex02's ring shift spins on 2 ranks or more (p only grows); on 1 rank it is the worked answer
SPIN_RANKS = ("    call.sendrecv(x, (r + shift) % p, out, (r - shift) % p)\n",
              "    while p > 1:\n        p += 1\n"
              "    call.sendrecv(x, (r + shift) % p, out, (r - shift) % p)\n")  # fmt: skip


@pytest.fixture
def place():
    """A folder others may enter (as root the wall's child runs as `nobody`): the submission,
    the results and TMPDIR (./tmp) of the grades; removed at the end, with any process still
    running from it (a grader's clean-up that failed would leave one)."""
    folder = tempfile.mkdtemp(prefix="minipar-endings-")
    os.chmod(folder, 0o755)
    os.mkdir(os.path.join(folder, "tmp"), 0o755)
    os.chmod(os.path.join(folder, "tmp"), 0o755)  # whatever the umask
    try:
        yield Path(folder)
    finally:
        for pid in _running_in(folder):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


def submission(place: Path, name: str, planted=None, folder="sub") -> Path:
    """A copy of the worked answer `name` in place/folder, with `planted` (old, new) in it."""
    sub = place / folder
    sub.mkdir(mode=0o755, exist_ok=True)
    text = (SOLUTIONS / f"{name}.py").read_text()
    if planted:
        assert planted[0] in text
        text = text.replace(*planted)
    (sub / f"{name}.py").write_text(text)
    os.chmod(sub / f"{name}.py", 0o644)
    return sub


class Grade:
    """`minipar grade --impl SUB --json results.json` in its own session, TMPDIR place/tmp;
    its stderr read as it comes (a thread), so that a line can be waited for."""

    def __init__(self, place: Path, sub: Path, *args):
        env = dict(os.environ, TMPDIR=str(place / "tmp"))
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # the grader's pytest makes its own
        self.results = place / "results.json"
        argv = ["-m", "minipar", "grade", "--impl", str(sub), "--json", str(self.results), *args]
        self.proc = subprocess.Popen([sys.executable, *argv], env=env, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)  # fmt: skip
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, text: str, limit: float = 120.0) -> None:
        end = time.monotonic() + limit
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, f"ended before {text!r}:\n{''.join(self.lines)}"
            assert time.monotonic() < end, f"no {text!r} in {limit:g} s:\n{''.join(self.lines)}"
            time.sleep(0.05)

    def end(self, limit: float = 60.0) -> int:
        try:
            self.proc.wait(limit)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"still running {limit:g} s after: {''.join(self.lines[-20:])}")
        self.reader.join(10)
        return self.proc.returncode

    def said(self) -> str:
        return "".join(self.lines)


def _running_in(folder) -> list[int]:
    """The processes whose command line names `folder` (a student's process names its copy)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(str(folder).encode() in w for w in words):
            found.append(int(pid))
    return found


def _gone(folder, limit: float = 10.0) -> list[int]:
    """The processes still running from `folder` after up to `limit` s."""
    end = time.monotonic() + limit
    while (left := _running_in(folder)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def test_sigterm_stops_a_grade_and_leaves_its_tmpdir_as_it_was(place):
    """SIGTERM while a student's function spins: exit 128 + 15, the results file says the
    grade was stopped (no points), the student's process is gone and TMPDIR is empty."""
    grade = Grade(place, submission(place, "ex12_checkpoint_interval", SPIN))
    grade.wait_for("running")  # Progress's heartbeat: a test past 3 s, the spinning one
    assert _running_in(place / "tmp"), "the wall's child should be spinning in the copy"
    grade.proc.send_signal(signal.SIGTERM)
    code = grade.end()
    assert code == 128 + signal.SIGTERM, grade.said()
    assert "stopped by SIGTERM" in grade.said()
    results = json.loads(grade.results.read_text())
    assert results and all(r["status"] == "failed" for r in results), results
    assert all("stopped by SIGTERM" in r["detail"] for r in results), results
    assert not _gone(place / "tmp"), "a student's process outlived the grade"
    assert os.listdir(place / "tmp") == []


def test_a_sigkilled_grades_leftovers_go_with_the_next_grade(place):
    """SIGKILL while a student's function spins: that process dies with the grader; what the
    grader left in TMPDIR, the next grade removes (and grades as ever)."""
    grade = Grade(place, submission(place, "ex12_checkpoint_interval", SPIN))
    grade.wait_for("running")
    grade.proc.send_signal(signal.SIGKILL)
    grade.end()
    assert not _gone(place / "tmp"), "the student's process outlived its grader"
    left = os.listdir(place / "tmp")
    assert left, "a SIGKILLed grade runs no clean-up: its folders are there to be swept"
    _graded_in_full(place)
    assert os.listdir(place / "tmp") == [], f"left by the killed grade: {left}"


@LONG
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_an_ending_while_ranks_run_leaves_nothing_in_tmpdir_or_dev_shm(place, sig):
    """The same while two ranks spin in a student's code (the warm pool's job, its fork
    server, MPICH's segment): after SIGTERM nothing is left; after SIGKILL the ranks leave
    the job by themselves (their segments unlinked) and the next grade removes the folders."""
    grade = Grade(place, submission(place, "ex02_ring_shift", SPIN_RANKS))
    grade.wait_for("on 2 ranks")
    # the job's segment: its ranks are forked by the pool's fork server, in a session of its
    # own (not the grader's children), and name TMPDIR in their command lines
    end = time.monotonic() + 120
    while not (ours := shm_leftovers.mapped(_running_in(place / "tmp"))):
        assert time.monotonic() < end and grade.proc.poll() is None, grade.said()
        time.sleep(0.1)
    time.sleep(1.0)  # the ranks are in the case, spinning
    grade.proc.send_signal(sig)
    grade.end(120)
    assert not _gone(place / "tmp", 60), "a rank or the fork server outlived the grade"
    if sig == signal.SIGKILL:
        _graded_in_full(place)
    assert os.listdir(place / "tmp") == []
    assert not [p for p in ours if os.path.exists(p)], "the job's segment stayed in /dev/shm"


def _graded_in_full(place: Path) -> None:
    """The next grade (of ex12's worked answer, with the same TMPDIR) gives it every point."""
    again = Grade(place, submission(place, "ex12_checkpoint_interval", folder="worked"))
    again.end(300)  # exit 1: the other exercises were not handed in
    results = json.loads(again.results.read_text())
    mine = [r for r in results if r["exercise"] == "ex12_checkpoint_interval"]
    assert mine and all(r["status"] == "passed" for r in mine), again.said()


def test_sigterm_stops_a_class_and_every_grader_in_it(place):
    """`minipar grade --submissions`: SIGTERM while a student's function spins stops every
    submission's grader as a timeout does, exits 128 + 15 and leaves TMPDIR as it was (the
    batch's copy of the uploads included)."""
    uploads = place / "uploads"
    uploads.mkdir(mode=0o755)
    os.chmod(uploads, 0o755)
    submission(place, "ex12_checkpoint_interval", SPIN, folder="uploads/ann")
    env = dict(os.environ, TMPDIR=str(place / "tmp"))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    argv = ["-m", "minipar", "grade", "--submissions", str(uploads), "--out", str(place / "out")]
    batch = subprocess.Popen([sys.executable, *argv], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)  # fmt: skip
    try:
        end = time.monotonic() + 120
        while not [p for p in _running_in(place / "tmp") if p != batch.pid]:
            assert batch.poll() is None and time.monotonic() < end, batch.stderr.read()
            time.sleep(0.1)
        time.sleep(3.0)  # past the grader's start: the wall's child spins in ex12
        batch.send_signal(signal.SIGTERM)
        _, said = batch.communicate(timeout=60)
    finally:
        if batch.poll() is None:
            os.killpg(batch.pid, signal.SIGKILL)
            batch.wait()
    assert batch.returncode == 128 + signal.SIGTERM, said
    assert "stopped by SIGTERM" in said, said
    assert not _gone(place / "tmp"), "a grader or a student's process outlived the class"
    assert os.listdir(place / "tmp") == []
