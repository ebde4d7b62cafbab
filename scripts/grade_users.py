"""Several students grading on emulated nodes at the same moment (issue 69): N unprivileged
users made for the run, each `minipar grade --impl SUB --nodes 2` at once, R times over, every
grade checked against what it must be. Root only (it makes the users).

    python scripts/grade_users.py                  3 users, 3 rounds
    python scripts/grade_users.py --users 4 -r 2   4 users, 2 rounds

Each user gets a copy of this checkout's tracked files and a virtual environment of its own
(Debian's /usr/bin/python3 where there is one: a venv made from a Python under /root is not
one the user can enter), made once and used by every round, and its own HOME and TMPDIR. In
each round one user's submission holds a planted slip (tests/planted.py; the user changes
round by round) and the others hold the worked answers (solutions/). Right means: the worked
answers full points on every exercise and exit 0; the slip's exercise below its points, every
other exercise at its points, and exit not 0. After each round no process of the users may be
left, nor a file of theirs in /tmp or /dev/shm outside their own folders, nor anything in
their TMPDIR.

The users, their processes and every file they made are removed at the end, also when the run
is interrupted (Ctrl-C, SIGTERM, SIGHUP): a grade still running gets SIGTERM first (it cleans up
after itself, as on a course platform's time limit), SIGKILL only STOP_GRACE seconds later.
With --keep the users' folders stay for the next run; what a kept TMPDIR still holds (an earlier
run's) is removed before round 1 and said, so that it is not counted as this run's. Prints the
grades, the seconds per grade (min / median / max) and the CPU the machine spent while grading
(/proc/stat).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grade_class import ROOT, cpu_times, grade_is_right, submission, write_submission  # noqa: E402

PREFIX = "minipar-grade-"
PYTHON = "/usr/bin/python3"
SHARED = ("/tmp", "/dev/shm")  # where a job's leftovers of every user would lie
STOP_GRACE = 30.0  # seconds a grade has, after SIGTERM, to clean up before SIGKILL


class Interrupted(Exception):
    """A signal ended the run: the cleanup still runs (raised from the handler)."""


def _on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def _as(user: str, command: str, env: dict, **popen) -> subprocess.Popen:
    """`bash -c command` as `user` (its own uid, gid and groups; env exactly as given), in a
    session of its own so that a timeout can kill the whole of it."""
    who = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"]
    return subprocess.Popen([*who, "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                             "bash", "-c", command], start_new_session=True, **popen)  # fmt: skip


def _user_env(home: Path, venv: Path | None = None) -> dict:
    path = "/usr/local/bin:/usr/bin:/bin"
    env = {"PATH": f"{venv}/bin:{path}" if venv else path, "HOME": str(home / "home"),
           "TMPDIR": str(home / "tmp"), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}  # fmt: skip
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    return env


class Users:
    """The users made for the run and everything of theirs; `remove` undoes it all."""

    def __init__(self, n: int, top: Path):
        self.names = [f"{PREFIX}{i}" for i in range(n)]
        self.top, self.uids, self.running = top, {}, []

    def make(self) -> list[str]:
        """The users made, each with its folders; what a kept run's TMPDIRs held, removed."""
        earlier = []
        for name in self.names:
            if _exists(name):  # a killed run's: nothing of it is wanted
                self._kill_all(name)
                subprocess.run(["userdel", name], capture_output=True, check=False)
            subprocess.run(["useradd", "-M", "-s", "/bin/sh", name], check=True)
            self.uids[name] = pwd.getpwnam(name).pw_uid
            home = self.home(name)
            for sub in ("home", "tmp"):
                (home / sub).mkdir(parents=True, exist_ok=True)
            shutil.chown(home, name, name)
            for sub in ("home", "tmp"):
                shutil.chown(home / sub, name, name)
            home.chmod(0o700)
            for entry in os.listdir(home / "tmp"):  # a kept run's: not this run's leftovers
                earlier.append(f"{name}: {entry}")
                _remove(str(home / "tmp" / entry))
        return earlier

    def home(self, name: str) -> Path:
        return self.top / name

    def leftovers(self) -> list[str]:
        """Each user's processes still alive, and its files in /tmp or /dev/shm or in its
        TMPDIR."""
        found = []
        for name, uid in self.uids.items():
            found += [f"{name}: process {p} {_cmdline(p)}" for p in _pids_of(uid)]
            found += [f"{name}: {path}" for path in _files_of(uid)]
            tmp = self.home(name) / "tmp"
            found += [f"{name}: {tmp / e}" for e in os.listdir(tmp)] if tmp.exists() else []
        return found

    def remove(self, keep: bool) -> list[str]:
        """A grade still running stopped (_stop), then every user's processes killed (by pid:
        only these users'), their files in /tmp and /dev/shm removed, the users deleted; the
        run's folder too unless kept. What was found left (nothing, after a clean run)."""
        for proc in self.running:  # all at once; then each waited for
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.running:
            _stop(proc)
        left = self.leftovers()
        for name, uid in self.uids.items():
            self._kill_all(name)
            for path in _files_of(uid):
                _remove(path)
        for name in self.uids:
            subprocess.run(["userdel", name], capture_output=True, check=False)
        if not keep:
            shutil.rmtree(self.top, ignore_errors=True)
        return left

    def _kill_all(self, name: str) -> None:
        uid = pwd.getpwnam(name).pw_uid
        end = time.monotonic() + 10
        while (pids := _pids_of(uid)) and time.monotonic() < end:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)


def _stop(proc: subprocess.Popen) -> str:
    """SIGTERM to a grade's process group, then SIGKILL after STOP_GRACE s: a SIGKILLed grade
    runs no clean-up (its folders stay until its user's next grade). What it still printed."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            return proc.communicate(timeout=wait)[0] or ""  # its pipe read: it never blocks
        except subprocess.TimeoutExpired:
            continue
    return ""


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _pids_of(uid: int) -> list[int]:
    """The live processes (zombies aside) whose real uid is `uid`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            pids.append(int(pid))
    return pids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return "(gone)"


def _files_of(uid: int) -> list[str]:
    """The entries in /tmp and /dev/shm that `uid` owns (its own folders lie deeper)."""
    return [os.path.join(folder, entry) for folder in SHARED for entry in os.listdir(folder)
            if _owner(os.path.join(folder, entry)) == uid]  # fmt: skip


def _owner(path: str) -> int | None:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def copy_checkout(dest: Path) -> None:
    """This checkout's tracked files, as they are now, under dest."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)


def make_venvs(users: Users, python: str) -> None:
    """Each user's copy of the checkout and its venv with minipar (editable) and its dev
    extras, made as that user, one user after another (pip's unpacking is the cost)."""
    for name in users.names:
        home = users.home(name)
        copy_checkout(home / "minipar")
        subprocess.run(["chown", "-R", f"{name}:{name}", str(home)], check=True)
        if (home / "venv" / "bin" / "python").exists():
            continue  # a kept run's (--keep): minipar is editable, the new copy is what runs
        began = time.monotonic()
        build = (f"set -e; cd {home}/minipar; {python} -m venv {home}/venv; "
                 f". {home}/venv/bin/activate; pip install -q torch==2.13.0 || pip install -q "
                 "torch --index-url https://download.pytorch.org/whl/cpu; "
                 "pip install -q -e '.[dev]'")  # fmt: skip
        proc = _as(name, build, _user_env(home), stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT, text=True)  # fmt: skip
        users.running.append(proc)
        out, _ = proc.communicate()
        users.running.remove(proc)
        if proc.returncode != 0:
            raise RuntimeError(f"{name}'s venv failed ({proc.returncode}):\n{out[-3000:]}")
        print(f"  {name}: venv made in {time.monotonic() - began:.0f} s", flush=True)


def grade_round(users: Users, kinds: dict, nodes: int, timeout: float) -> dict:
    """Each user's `minipar grade --impl` on its submission, all started at the same moment:
    name -> (exit status, seconds, results or None, the output's tail)."""
    started = {}
    for name in users.names:
        home = users.home(name)
        out = home / "results.json"
        out.unlink(missing_ok=True)
        command = (f"cd {home}/home && python -m minipar grade --impl {home}/sub --nodes "
                   f"{nodes} --format gradescope --json {out}")  # fmt: skip
        proc = _as(name, command, _user_env(home, home / "venv"), stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT, text=True)  # fmt: skip
        users.running.append(proc)
        started[name] = (proc, time.monotonic())
    done = {}
    for name, (proc, began) in started.items():
        try:
            text, _ = proc.communicate(timeout=max(1.0, began + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            text = _stop(proc) + f"\n(stopped after {timeout:g} s)"
        seconds = time.monotonic() - began
        users.running.remove(proc)
        out = users.home(name) / "results.json"
        results = json.loads(out.read_text()) if out.exists() else None
        done[name] = (proc.returncode, seconds, results, text[-2500:])
    return done


def wrong_grades(kind: str, odd: str | None, code: int, results: dict | None,
                 worth: dict) -> list[str]:  # fmt: skip
    """What is wrong with one grade (nothing: right)."""
    if results is None:
        return [f"no results.json (exit {code})"]
    got = dict.fromkeys(worth, 0.0)  # each test's score is written to 6 decimals: summed, 3
    for test in results["tests"]:
        got[test["tags"][0]] = got.get(test["tags"][0], 0.0) + test["score"]
    wrong = [f"{ex} {got[ex]:g} of {points:g}" for ex, points in worth.items()
             if not grade_is_right(kind, odd, ex, round(got[ex], 3), points)]  # fmt: skip
    if (code == 0) != (kind == "worked"):
        wrong.append(f"exit {code}")
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=3)
    parser.add_argument("-r", "--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900, help="seconds one grade may take")
    parser.add_argument("--seed", type=int, default=0, help="which slips are planted")
    parser.add_argument(
        "--python",
        default=PYTHON if os.path.exists(PYTHON) else sys.executable,
        help="the Python the users' venvs are made from (one they can run)",
    )
    parser.add_argument(
        "--keep",
        default=None,
        help="make the users' folders (venvs) here and keep them for a later run",
    )
    args = parser.parse_args()
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        print("grade_users.py makes users: root, useradd and setpriv", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from minipar.course import gradebook

    worth = gradebook.points_table(ROOT / "solutions" / "points.toml")[1]
    rng = random.Random(args.seed)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    top = Path(args.keep or tempfile.mkdtemp(prefix="minipar-users-"))
    top.mkdir(parents=True, exist_ok=True)
    top.chmod(0o755)  # each user enters its own folder below
    users = Users(args.users, top)
    seconds, wrong, left, code = [], [], [], 1
    try:
        earlier = users.make()
        if earlier:
            print(f"removed from the kept TMPDIRs, an earlier run's: {'; '.join(earlier)}")
        print(f"{args.users} users, their venvs from {args.python}:", flush=True)
        make_venvs(users, args.python)
        for n in range(args.rounds):
            kinds = {}
            for i, name in enumerate(users.names):
                kind = "slip" if i == n % args.users else "worked"
                files, odd = submission(kind, rng)
                sub = users.home(name) / "sub"
                shutil.rmtree(sub, ignore_errors=True)
                write_submission(sub, files)
                subprocess.run(["chown", "-R", f"{name}:{name}", str(sub)], check=True)
                kinds[name] = (kind, odd)
            cpu0 = cpu_times()
            done = grade_round(users, kinds, args.nodes, args.timeout)
            cpu1 = cpu_times()
            busy = 1 - (cpu1[1] - cpu0[1]) / max(cpu1[0] - cpu0[0], 1e-9)
            print(f"round {n + 1}: the machine's CPU {busy:.0%} busy", flush=True)
            for name, (rc, took, results, tail) in done.items():
                kind, odd = kinds[name]
                bad = wrong_grades(kind, odd, rc, results, worth)
                score = f"{results['score']:g}" if results else "-"
                what = f"{kind} ({odd})" if odd else kind
                verdict = "right" if not bad else "WRONG: " + "; ".join(bad)
                print(f"  {name}: {what}: {score} of {sum(worth.values()):g}, exit {rc}, "
                      f"{took:.1f} s: {verdict}", flush=True)  # fmt: skip
                if bad:
                    print("    " + tail.replace("\n", "\n    "))
                    wrong.append(f"round {n + 1}, {name}: {'; '.join(bad)}")
                seconds.append(took)
            time.sleep(0.5)  # a job's last processes reaped
            now_left = users.leftovers()
            left += [f"round {n + 1}: {line}" for line in now_left]
            print("  left behind: " + ("nothing" if not now_left else "; ".join(now_left)))
        code = 0 if not wrong and not left else 1
    except Interrupted as why:
        print(f"interrupted ({why}): removing the users and their files", file=sys.stderr)
        code = 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the cleanup is not cut short
        users.remove(keep=bool(args.keep))
    if seconds:
        ordered = sorted(seconds)
        print(
            f"{len(seconds)} grades ({args.users} users at once, {args.rounds} rounds, "
            f"--nodes {args.nodes}): {len(seconds) - len(wrong)} right, {len(wrong)} wrong"
        )
        print(f"seconds a grade (started together): min {ordered[0]:.1f} / median "
              f"{statistics.median(ordered):.1f} / max {ordered[-1]:.1f}")  # fmt: skip
        print("left behind after the rounds: " + ("nothing" if not left else f"{len(left)}"))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
