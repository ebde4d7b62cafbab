"""Fault injection: a rank raises, exits, or calls something else in the middle of a job (see
tests/faults/inject.py). The job must end non-zero, within the timeout of the fault, never hang,
and its output must name the rank at fault, on both transports: MPI through `minipar run` (which
must return the job's exit status) and torch.distributed (gloo) under torch.multiprocessing
(spawned, or forked: SPAWNED), plus one job under torchrun, where minipar's own excepthook ends
the job.

The jobs are independent, so a transport's jobs run JOBS_AT_ONCE at a time on threads the first
time a test asks for one of them; each test then checks one job.
"""

import functools
import os
import re
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import conftest
import pytest
from conftest import ROOT

INJECT = os.path.join(ROOT, "tests", "faults", "inject.py")
TIMEOUT = 3  # MINIPAR_TIMEOUT inside the jobs: how long a rank waits for a peer
SLACK = 20  # seconds beyond TIMEOUT a job may take to end after its fault (abort, teardown)
JOB_LIMIT = 150  # the hard limit: no job can outlive it, whatever goes wrong
pytestmark = pytest.mark.own_job  # the faults end their jobs: each needs one of its own
EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"

# (transport, mode, debug, ranks): what each job must show. "rc": exact exit status or "nonzero";
# "says": fragments the output must contain (every one of them).
EXPECT = {
    ("mpi", "ok", False, 3): ("zero", ["rank 0: finished", "rank 2: finished"]),
    ("mpi", "raise_mid", False, 3): (
        "nonzero",
        ["[rank 1] RuntimeError: injected fault (raise_mid)", "[rank 1] minipar: aborting"],
    ),
    ("mpi", "raise_between", True, 3): (
        "nonzero",
        ["[rank 1] RuntimeError: injected fault (raise_between)"],
    ),
    ("mpi", "sys_exit_mid", False, 3): (
        3,
        [
            "[rank 1] minipar: sys.exit(3) inside all_reduce (algorithm two_step_ring) on group "
            "world, step 1"
        ],
    ),  # fmt: skip
    ("mpi", "sys_exit", False, 2): (  # rank 0's wait asks rank 1, which is at its exit
        "nonzero",
        [
            "[rank 0] minipar.errors.MismatchError: rank 0 called all_reduce(op=SUM, float64 x 8) "
            "on group world (call #1) but rank 1 is at the end of the job (exit) without making it",
            "[rank 1] minipar.errors.MismatchError (found at exit): rank 0 called all_reduce(",
        ],
    ),
    ("mpi", "sys_exit", True, 3): (
        "nonzero",
        ["CommTimeoutError: debug check before all_reduce (call #1)", "from rank 1 (tag"],
    ),
    ("mpi", "leave_early", False, 2): (  # exits 0, but rank 0 waits for it: comm/guards/leaving.py
        "nonzero",
        [
            "[rank 1] minipar: this rank is leaving the job, but",
            "from rank 0: call #1 on group world",
        ],
    ),
    ("mpi", "os_exit_mid", False, 3): (  # hydra's banner names a pid; minipar run the rank
        "nonzero",
        ["minipar run: rank 1 ended first, without exiting"],
    ),
    ("mpi", "other_call", False, 2): (
        "nonzero",
        ["[rank 0] minipar.errors.MismatchError", "but rank 1 called broadcast(src=0"],
    ),
    ("mpi", "other_call", True, 3): (
        "nonzero",
        ["MismatchError", "  ranks 0, 2: call #1 all_reduce(", "  rank 1: call #1 broadcast("],
    ),
    ("mpi", "other_count", False, 2): (
        "nonzero",
        ["[rank 0] minipar.errors.MismatchError", "rank 1 called all_reduce(op=SUM, float64 x 16)"],
    ),
    ("mpi", "other_count", True, 3): (
        "nonzero",
        ["MismatchError", "  rank 1: call #1 all_reduce(algorithm="],
    ),
    # the shared-memory transport (MINIPAR_TRANSPORT=shm): the others wait on a window's
    # counter, not a message, and must end as promptly
    ("shm", "raise_between", False, 3): (
        "nonzero",
        ["[rank 1] RuntimeError: injected fault (raise_between)", "[rank 1] minipar: aborting"],
    ),
    ("shm", "sys_exit", False, 2): (
        "nonzero",
        ["CommTimeoutError: all_reduce (algorithm", "@shm)", "waiting for rank 1 to publish"],
    ),
    ("torch", "raise_mid", False, 2): (
        "nonzero",
        ["Process 1 terminated with the following error", "injected fault (raise_mid)"],
    ),
    ("torch", "other_call", True, 2): (
        "nonzero",
        ["MismatchError", "  rank 1: call #1 broadcast("],
    ),
    ("torch", "other_count", False, 2): (
        "nonzero",
        ["MismatchError", "rank 1 called all_reduce(op=SUM, float64 x 16)", "gloo has no probe"],
    ),
    ("torchrun", "raise_mid", False, 2): (  # minipar's own excepthook: spawn bypasses it
        "nonzero",
        ["[rank 1] RuntimeError: injected fault (raise_mid)", "[rank 1] minipar: aborting"],
    ),
}
EXTENDED_EXPECT = {
    ("torch", "sys_exit", False, 2): ("nonzero", ["process 1 terminated with exit code 3"]),
    ("torch", "ok", False, 2): ("zero", ["rank 0: finished", "rank 1: finished"]),
    ("torch", "sys_exit_mid", False, 2): (
        "nonzero",
        ["[rank 1] minipar: sys.exit(3) inside all_reduce", "process 1 terminated"],
    ),
    ("torch", "os_exit_mid", False, 2): ("nonzero", ["process 1 terminated with exit code 3"]),
    ("torch", "raise_between", False, 2): ("nonzero", ["Process 1 terminated", "raise_between"]),
    ("torch", "other_call", False, 2): ("nonzero", ["MismatchError", "rank 1 called broadcast("]),
    ("torch", "other_count", True, 2): ("nonzero", ["MismatchError", "shape=(16,)"]),
    ("mpi", "raise_between", False, 3): ("nonzero", ["[rank 1] RuntimeError: injected fault"]),
    ("mpi", "sys_exit_mid", True, 3): (3, ["[rank 1] minipar: sys.exit(3) inside all_reduce"]),
}
if EXTENDED:
    EXPECT.update(EXTENDED_EXPECT)

# Issue 27: mistakes that no message shows, made by every rank at once (tests/faults/inject.py),
# with minipar's defaults (no MINIPAR_TIMEOUT: a mistake nobody caught would hang until
# JOB_LIMIT). Every rank must raise MismatchError within DETECT seconds of the last rank's
# mistake (or, for `_last`, the script ending right after it, report it at exit; for `_finalize`,
# finalize() called right after it, raise it there, saying so with the rank), and the job
# must end non-zero. (mode: fragments of every rank's message)
MISTAKES = {
    "own_root": ["called broadcast(src=", "float32 x 8) on group world but rank", "in src"],
    "dst": ["called reduce(dst=", "op=SUM, float32 x 8) on group world but rank", "in dst"],
    "scatter_src": ["called scatter(src=", "float64 x 2) on group world but rank", "in src"],
    "other_group": [
        "called all_reduce(op=SUM, float64 x 8) on group",
        "on group other",
        "in group",
    ],
    "own_root_last": ["called broadcast(src=", "in src"],
    "scatter_src_last": ["called scatter(src=", "in src"],
    "scatter_src_finalize": ["called scatter(src=", "in src"],
}
SAYS = {  # what a rank's line says, by the mode's ending (else "MismatchError: ", the excepthook)
    "_last": "MismatchError (found at exit): ",
    "_finalize": "MismatchError (found at finalize()): ",
}
MISTAKE_RANKS = [2, 3, 4]
MISTAKE_JOBS = [(mode, ranks) for mode in MISTAKES for ranks in MISTAKE_RANKS]
DETECT = 2.0  # seconds from the last rank's mistake to every rank's MismatchError
EXIT_LIMIT = 10.0  # seconds from the mistake to the end of a `_last` job (its ranks report first)

# A rank that sys.exit()s outside any collective leaves messages its peers already sent it
# unreceived, or not yet: whichever came first, the output must name it. Either the rank finds
# them as it leaves and says so (comm/guards/leaving.py), or the others' waits ask it what it is
# doing (comm/guards/stall.py) and both raise (with debug mode, whose check asks nobody: the others
# time out waiting for it, and say that it is at the end of the job).
LEAVING = ["[rank 1] minipar: this rank is leaving the job, but", "never received"]
OR_ELSE = {("mpi", "sys_exit", False, 2): LEAVING, ("mpi", "sys_exit", True, 3): LEAVING}


# jobs at once: their waits overlap, but each is 2-4 ranks on 2 cores, beside the busy lane's
# pool jobs (tests/lanes.py); 5 at once made the collectives' 2- and 4-rank matrices beside them
# ~30% slower (two A/B pairs: 52-55 s against 35-42 s) for no faster faults (67-69 s, 63-73 s)
JOBS_AT_ONCE = 2
SPAWNED = {("raise_mid", False)}  # torch jobs under torch.multiprocessing.spawn; the others'
# ranks are forked (torch imported once, not once per rank): both end through ProcessContext


def command(transport, mode, debug, ranks):
    flags = ["--debug"] if debug else []
    if transport in ("mpi", "shm"):  # through `minipar run`, which must hand back the job's status
        run = [sys.executable, "-m", "minipar", "run", "-n", str(ranks), INJECT, mode, *flags]
        return ["env", f"MINIPAR_TRANSPORT={transport}", *run]
    if transport == "torchrun":
        run = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        return [sys.executable, *run, INJECT, mode, *flags]
    if (mode, debug) in SPAWNED:
        flags.append("--spawn")
    return [sys.executable, INJECT, mode, "--torch", str(ranks), *flags]


def run_job(key):
    """Run one job (see conftest.run_job): test_no_orphans checks that nothing outlives it."""
    return per_rank(conftest.run_job(command(*key), TIMEOUT, JOB_LIMIT))


FOLDED = re.compile(r"^\[rank ([\d, -]+)\](?: [^:]* line \d+:)? (.*)$")


def per_rank(done):
    """`minipar run` says an error raised alike on many ranks once (`[rank 0, 1] x.py line 5:
    E: ...`, launcher/errors_once.py): each rank's line again (`[rank 0] E: ...`), as the
    checks below read them, the job's other fields kept."""
    rc, output, *rest = done
    lines = []
    for line in output.splitlines():
        folded = FOLDED.match(line)
        if not folded:
            lines.append(line)
            continue
        for part in folded.group(1).split(", "):
            first, _, last = part.partition("-")
            lines += [
                f"[rank {r}] {folded.group(2)}" for r in range(int(first), int(last or first) + 1)
            ]
    return (rc, "\n".join(lines) + "\n", *rest)


def family(transport: str) -> str:
    return "mpi" if transport in ("mpi", "shm") else "torch"


def run_mistake(key):
    mode, ranks = key
    argv = [sys.executable, "-m", "minipar", "run", "-n", str(ranks), INJECT, mode]
    return per_rank(conftest.run_job(argv, None, JOB_LIMIT))


@functools.cache
def results(which):
    """Every job of one family ("mpi", "torch" with torchrun, or "mistakes": MISTAKE_JOBS), run
    JOBS_AT_ONCE at a time on threads (the first test asking waits)."""
    if which == "mistakes":
        with ThreadPoolExecutor(max_workers=JOBS_AT_ONCE) as pool:
            return dict(zip(MISTAKE_JOBS, pool.map(run_mistake, MISTAKE_JOBS)))
    keys = [key for key in EXPECT if family(key[0]) == which]
    with ThreadPoolExecutor(max_workers=JOBS_AT_ONCE) as pool:
        return dict(zip(keys, pool.map(run_job, keys)))


@pytest.mark.parametrize(
    "transport,mode,debug,ranks", list(EXPECT), ids=["-".join(map(str, k)) for k in EXPECT]
)
def test_fault(transport, mode, debug, ranks):
    key = (transport, mode, debug, ranks)
    rc, output, start, end, _ = results(family(transport))[key]
    want_rc, fragments = EXPECT[key]
    where = f"{' '.join(command(*key)[1:])} exited {rc} after {end - start:.1f} s"
    assert rc != 124, f"{where}: the job hung\n{output[-3000:]}"
    if want_rc == "zero":
        assert rc == 0, f"{where}\n{output[-3000:]}"
    elif want_rc == "nonzero":
        assert rc != 0, f"{where}\n{output[-3000:]}"
    else:
        assert rc == want_rc, f"{where}\n{output[-3000:]}"
    if key in OR_ELSE and all(fragment in output for fragment in OR_ELSE[key]):
        fragments = []  # the leaving rank named itself (see OR_ELSE)
    for fragment in fragments:
        assert fragment in output, f"{where}: {fragment!r} not in the output\n{output[-3000:]}"
    fault = re.search(r"\[fault\] rank \d+ \S+ at ([0-9.]+)", output)
    if mode != "ok":
        assert fault, f"{where}: the fault never happened\n{output[-3000:]}"
        took = end - float(fault.group(1))
        assert took < TIMEOUT + SLACK, f"{where}: ended {took:.1f} s after the fault"


@pytest.mark.parametrize("mode,ranks", MISTAKE_JOBS, ids=[f"{m}-{n}" for m, n in MISTAKE_JOBS])
def test_mistake(mode, ranks):
    rc, output, start, end, _ = results("mistakes")[(mode, ranks)]
    where = f"minipar run -n {ranks} inject.py {mode} exited {rc} after {end - start:.1f} s"
    assert rc != 124, f"{where}: the job hung\n{output[-3000:]}"
    assert rc != 0, f"{where}\n{output[-3000:]}"
    marked = {
        int(r): float(t)
        for r, t in re.findall(rf"\[fault\] rank (\d+) {mode} at ([0-9.]+)", output)
    }
    marks = marked.values()
    # a rank still in the barrier before its mistake when the others' mistake failed the group
    # (a peer it waits for descheduled on the shared cores) raises there, as it must: a failed
    # group fails every wait on it. It names the same difference, found live
    assert len(marks) >= min(2, ranks), (
        f"{where}: {len(marks)} ranks made the mistake\n{output[-3000:]}"
    )
    for r in range(ranks):
        said = "MismatchError: "  # (the excepthook's; a rank with no mark raised live)
        if r in marked:
            said = next((v for k, v in SAYS.items() if mode.endswith(k)), said)
        lines = [
            line for line in output.splitlines() if f"[rank {r}] minipar.errors.{said}" in line
        ]
        assert lines, f"{where}: rank {r} did not say it\n{output[-3000:]}"
        missing = [f for f in MISTAKES[mode] if f not in lines[0]]
        assert not missing, f"{where}: {missing} not in rank {r}'s {lines[0]}"
        if mode.endswith("_last") or r not in marked:
            continue
        caught = re.search(rf"\[fault\] rank {r} MismatchError at ([0-9.]+)", output)
        took = float(caught.group(1)) - max(marks)
        assert took < DETECT, f"{where}: rank {r} raised {took:.2f} s after the mistake"
    if mode.endswith("_last"):
        took = end - max(marks)
        assert took < EXIT_LIMIT, f"{where}: the job ended {took:.1f} s after the mistake"


def session_processes(sessions) -> list[int]:
    """Live processes in any of these sessions (each job was started as a session of its own,
    so its mpiexec, proxies, ranks and spawned children all carry the job's pid as session id)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) in sessions and fields[0] != "Z":  # fields: state ppid pgrp session
            found.append(int(entry))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")
@pytest.mark.parametrize("transport", ["mpi", "torch", "mistakes"])
def test_no_orphans(transport):
    """Once a transport's fault jobs have ended, none of their processes is left running."""
    sessions = {job[-1] for job in results(transport).values()}
    deadline = time.time() + 5
    while session_processes(sessions) and time.time() < deadline:
        time.sleep(0.1)
    left = session_processes(sessions)
    for pid in left:  # ours: clean up before failing, so nothing outlives the test run
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left by the fault jobs: {left}"
