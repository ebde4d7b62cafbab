"""Launching as users expect (issue 15): any program under `minipar run`, whole lines per rank,
rank tags, tables that are never cut off a terminal, `minipar.launch(fn)`, hints on request."""

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from minipar import cli, launcher, term
from minipar.cli import grade, run
from minipar.course import exercises
from minipar.launcher import relay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def minipar(*args, env=None, timeout=90):
    cmd = [sys.executable, "-m", "minipar", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def script(tmp_path, body: str, name: str = "job.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


# -- 15.1 any program; 15.2 whole lines; 15.5 tables off a terminal ------------------------------

LINES = """
import sys
import minipar
from minipar.term import Console
from rich.table import Table

comm = minipar.init()
r, n = comm.rank, comm.size
for i in range(150):  # print() writes each argument apart: the pieces must not interleave
    print("RANK", r, n, i, "x" * 40, *sys.argv[1:])
print(str(r) * 100_000)  # one line far longer than any pipe buffer
if r == 0:
    grid = Table(title="wide")
    for c in range(8):
        grid.add_column(f"column number {c}")
    grid.add_row(*[f"cell {c} of a wide table" for c in range(8)])
    Console().print(grid)
print("unfinished last line of rank", r, end="")
"""


@pytest.mark.own_job
def test_run_python_script_whole_lines_tags_and_a_wide_table(tmp_path):
    """`minipar run -n 3 --tag-output python job.py ARGS`: the mpiexec habit; every line whole
    and tagged with the rank that printed it; rank 0's 8-column table not cut (no terminal)."""
    path = script(tmp_path, LINES)
    done = minipar("run", "-n", "3", "--tag-output", "python", path, "--lr", "0.1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    short = re.compile(r"\[rank(\d)\]: RANK (\d) 3 (\d+) x{40} --lr 0\.1")
    counts = [0, 0, 0]
    for line in lines:
        m = short.fullmatch(line)
        if m:
            assert m[1] == m[2], line
            counts[int(m[1])] += 1
        elif len(line) > 1000:
            rank = line[len("[rankX]: ")]
            assert line == f"[rank{rank}]: " + rank * 100_000, line[:80]
            counts[int(rank)] += 1000
        else:
            assert line.startswith("[rank"), f"an untagged or torn line: {line[:120]!r}"
    assert counts == [1150] * 3, counts
    for r in range(3):
        assert f"[rank{r}]: unfinished last line of rank {r}" in lines
    assert "…" not in done.stdout and "..." not in done.stdout
    for c in range(8):
        assert f"cell {c} of a wide table" in done.stdout


@pytest.mark.own_job
def test_run_any_executable_module_and_env_tagging(tmp_path):
    env = dict(os.environ, MINIPAR_TAG_OUTPUT="1")
    done = minipar("run", "-n", "2", "echo", "hello", env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[rank0]: hello", "[rank1]: hello"]
    done = minipar("run", "-n", "2", "python", "-m", "platform")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2 and "[rank" not in done.stdout
    done = minipar("run", "-n", "2", "no_such_program_here")
    assert done.returncode == 2 and "no such script or program" in done.stderr


def help_of(name: str, capsys) -> str:
    with pytest.raises(SystemExit):
        cli.main([name, "--help"])
    return capsys.readouterr().out


def test_run_parses_the_program_forms(tmp_path, capsys):
    path = script(tmp_path, "pass\n")
    parse = cli.build_parser("run").parse_args
    cases = {
        ("python", "-m", "mod", "-x"): ["python", "-m", "mod", "-x"],
        ("python", path, "-n", "7"): ["python", path, "-n", "7"],
        (path, "-n", "7"): [sys.executable, path, "-n", "7"],
        ("--", path): [sys.executable, path],
        ("echo", "hi"): ["echo", "hi"],
    }
    for argv, program in cases.items():
        ns = parse(["run", "-n", "4", *argv])
        assert ns.n == 4 and run.program(ns) == program, argv
    ns = parse(["run", "-n", "2", "-m", "mod", "a"])
    assert run.program(ns) == [sys.executable, "-m", "mod", "a"]
    text = help_of("run", capsys)
    assert "run -n 4 python script.py" in text and "--tag-output" in text
    assert "MINIPAR_TAG_OUTPUT" in text


def loaded_by(args: list[str], **kwargs):
    """(the finished `python -X importtime ARGS`, the names of the modules it imported)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True,
                          text=True, timeout=60, **kwargs)  # fmt: skip
    return done, {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}


def test_the_relays_rank_side_loads_nothing_heavy():
    """Every rank of `minipar run` starts as `python -m minipar.launcher relay ...` and then
    becomes the program: that first interpreter must not load numpy, mpi4py or torch (it did,
    through the notebook side: ~0.3 s of a core per rank, for nothing)."""
    done, loaded = loaded_by(["-m", "minipar.launcher"])
    assert done.returncode != 0 and "usage" in done.stderr, done.stderr[-500:]
    assert not loaded & {"numpy", "mpi4py", "torch", "minipar.runtime"}, sorted(loaded)


@pytest.mark.own_job
def test_minipar_run_itself_loads_nothing_heavy(tmp_path):
    """`minipar run` starts every job (the suite's fault jobs: some 50): a job that goes well
    needs mpi4py (which MPI, which mpiexec) but not numpy (it loaded it finding libmpi's path
    through comm/transport/cuda.py) nor rich (only for its error lines): 0.6 -> 0.35 s of a core."""
    done, loaded = loaded_by(["-m", "minipar", "run", "-n", "1", "--", "true"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mpi4py.MPI" in loaded, sorted(loaded)  # (the check reads what it should)
    assert not loaded & {"numpy", "rich", "torch", "minipar.runtime"}, sorted(loaded)


def test_relay_tells_ranks_the_terminal_width_only_when_there_is_one():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    one = relay.Relay(2, tag=True, out=Tty())
    two = relay.Relay(2, out=io.StringIO())
    try:
        env = one.environ({})
        assert env["FORCE_COLOR"] == "1" and int(env["COLUMNS"]) >= 40
        assert two.environ({}) == {}  # no terminal: the ranks' tables size themselves
        wrapped = [sys.executable, "-m", "minipar.launcher", "relay", one.folder, "--", "echo", "x"]
        assert one.wrap(["echo", "x"]) == wrapped
    finally:
        one.close()
        two.close()
    assert not os.path.exists(one.folder)


def test_console_fits_a_table_off_a_terminal_and_keeps_a_terminals_width():
    from rich.table import Table

    grid = Table()
    for c in range(6):
        grid.add_column(f"a rather long header {c}")
    grid.add_row(*[f"value {c} that must survive" for c in range(6)])
    out = io.StringIO()
    term.Console(file=out, width=80).print(grid)
    text = out.getvalue()
    assert all(f"value {c} that must survive" in text for c in range(6)), text
    assert "…" not in text and max(map(len, text.splitlines())) > 80
    from rich.rule import Rule

    out = io.StringIO()
    term.Console(file=out, width=40).print(Rule("a rule whose title is longer than forty columns"))
    assert "a rule whose title is longer than forty columns" in out.getvalue()
    out = io.StringIO()
    term.Console(file=out, width=80, force_terminal=True, color_system=None).print(grid)
    assert max(map(len, out.getvalue().splitlines())) <= 80  # a terminal: its width rules


# -- 15.3 Open MPI as root ----------------------------------------------------------------------


def test_open_mpi_as_root_gets_consent_from_the_launcher(monkeypatch):
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT", raising=False)
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", raising=False)
    monkeypatch.setattr(launcher.mpiexec, "find_mpiexec", lambda: "mpiexec")
    for flavor, root, consent in [("openmpi", True, "1"), ("openmpi", False, None),
                                  ("mpich", True, None)]:  # fmt: skip
        monkeypatch.setattr(launcher.mpiexec, "mpi_flavor", lambda f=flavor: f)
        monkeypatch.setattr(launcher.mpiexec, "is_root", lambda r=root: r)
        env = launcher.command(2, ["job.py"])[1]
        assert env.get("OMPI_ALLOW_RUN_AS_ROOT") == consent, (flavor, root)
        assert env.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM") == consent, (flavor, root)


# -- 15.6 minipar.launch ------------------------------------------------------------------------

NOTEBOOK = """
import os, sys, time
import minipar

def total(scale):  # defined in __main__: the ranks get it by value
    import numpy as np
    minipar.init()
    x = np.full(2, float(minipar.get_rank() + 1))
    minipar.all_reduce(x)
    print("rank", minipar.get_rank(), "says hello")
    return minipar.get_rank(), float(x[0]) * scale

def fails():
    import time
    import numpy as np
    minipar.init()
    if minipar.get_rank() == 2:
        raise ValueError("rank two refuses")
    if minipar.get_rank() == 1:
        time.sleep(120)  # busy elsewhere: the job must still end at once
    minipar.all_reduce(np.ones(2))  # rank 0 would wait for rank 2
    return "unreachable"

def no_init():  # no minipar.init(): launch has initialised minipar on every rank
    import numpy as np
    x = np.full(2, float(minipar.get_rank() + 1))
    minipar.all_reduce(x)
    before = (minipar.get_backend(), minipar.get_world_size(), float(x[0]))
    minipar.init_process_group("mpi", world_size=0)  # a torch program's set-up takes it over
    minipar.all_reduce(x)
    minipar.destroy_process_group()
    return before, float(x[0]), minipar.is_initialized()

def gloo_style():  # init_process_group("gloo") replaces the launch's MPI world
    import torch
    minipar.init_process_group("gloo")
    t = torch.ones(1)
    minipar.all_reduce(t)
    backend = minipar.get_backend()
    minipar.destroy_process_group()
    return backend, t.item()

print("RESULTS", minipar.launch(total, args=(10,), n=3))
print("NO_INIT", minipar.launch(no_init, n=3))
print("GLOO", minipar.launch(gloo_style, n=2))
start = time.monotonic()
try:
    minipar.launch(fails, n=3, timeout=100)
except minipar.RankError as error:
    print("RANK_ERROR", error.rank, repr(str(error)))
print("SECONDS", time.monotonic() - start)
mark = ("MINIPAR_TEST_MARK=" + os.environ["MINIPAR_TEST_MARK"]).encode()

def ours(pid):  # a process of this session's jobs (the ranks inherit the mark)
    try:
        return pid != str(os.getpid()) and mark in open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        return False

print("LEFT", sum(ours(p) for p in os.listdir("/proc") if p.isdigit()))
"""


@pytest.mark.own_job
def test_launch_runs_a_main_function_on_ranks_and_reports_the_failing_rank(tmp_path):
    """launch(fn): fn's results in rank order, minipar initialised before fn (one that never
    calls init, one whose init_process_group takes the world over or replaces it), a failing
    rank named with its traceback, the job ended at once, no process left behind."""
    path = script(tmp_path, NOTEBOOK, "session.py")
    mark = dict(os.environ, MINIPAR_TEST_MARK=f"{os.getpid()}-{time.time_ns()}", PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, path], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=mark
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "RESULTS [(0, 60.0), (1, 60.0), (2, 60.0)]" in out, out + done.stderr
    assert f"NO_INIT {[(('mpi', 3, 6.0), 18.0, False)] * 3}" in out, out + done.stderr
    assert "GLOO [('gloo', 2.0), ('gloo', 2.0)]" in out, out + done.stderr
    for r in range(3):
        assert f"rank {r} says hello" in out  # streamed through
    line = next(ln for ln in out.splitlines() if ln.startswith("RANK_ERROR"))
    assert line.startswith("RANK_ERROR 2 ") and "rank 2 of 3 raised" in line
    assert "Traceback" in line and "ValueError: rank two refuses" in line
    assert "LEFT 0" in out
    seconds = float(out.split("SECONDS ", 1)[1].split()[0])
    assert seconds < 60, seconds  # not the 100 s timeout, nor rank 1's 120 s sleep


def test_launch_rejects_bad_arguments_before_starting_anything():
    import minipar

    with pytest.raises(ValueError, match="positive integer, got 0"):
        minipar.launch(print, n=0)
    with pytest.raises(TypeError, match="callable"):
        minipar.launch("print", n=2)
    assert minipar.launch.run is launcher.run  # `launch.run(...)` of old still works


# -- 15.7 hints on request ----------------------------------------------------------------------


def test_grade_prints_hints_only_on_request(capsys):
    from rich.console import Console

    results = [grade.Result("ex03_ring_allreduce", "values", "not started", "SECRET_HINT")]
    for hints, shown in ((False, False), (True, True)):
        console = Console(record=True, width=120)
        grade.report(console, results, "exercises", hints=hints)
        assert ("SECRET_HINT" in console.export_text()) is shown
    assert "--hints" in help_of("grade", capsys)


def test_exercises_generate_without_hints(tmp_path, capsys):
    written = exercises.generate(tmp_path, hints=False)
    assert len(written) == len(exercises.sources()) + 1
    for path in exercises.sources():
        text = (tmp_path / path.name).read_text()
        hinted = exercises.generated(path)[0]
        assert text.count("raise NotImplementedError(") == hinted.count(
            "raise NotImplementedError("
        )
        assert all(
            line.strip() == f'raise NotImplementedError("{exercises.NO_HINT}")'
            for line in text.splitlines()
            if "raise NotImplementedError(" in line
        ), path.name
    assert exercises.stale(tmp_path, hints=False) == []
    ns = cli.build_parser("exercises").parse_args(["exercises", "--generate", "--no-hints"])
    assert ns.generate and ns.no_hints
    assert "--generate --no-hints" in help_of("exercises", capsys)


def test_the_shipped_exercises_are_generated_from_the_solutions():
    """exercises/ as `minipar exercises --generate` writes it (no hints): a solution added or
    changed without regenerating fails here, not in a student's hands."""
    assert exercises.stale(hints=False) == [], "run `minipar exercises --generate`"


def test_hydra_leftovers_removed_only_when_no_process_holds_them(tmp_path, monkeypatch):
    """An aborted MPICH job leaves /tmp/hydra_hwloc_xmlfile_*: the files written since the job
    began go once no process holds them open (a live job's proxy holds its own: it stays, and
    so do older ones)."""
    from minipar.launcher import job_files, stop

    old, new = tmp_path / "hydra_hwloc_xmlfile_old", tmp_path / "hydra_hwloc_xmlfile_new"
    for path in (old, new):
        path.write_text("<topology/>")
    began = time.time()
    os.utime(old, (began - 60, began - 60))
    monkeypatch.setattr(job_files, "HYDRA_TOPOLOGY", str(tmp_path / "hydra_hwloc_xmlfile_*"))
    with open(new) as held:  # as a live proxy holds its file
        assert stop.remove_hydra_leftovers(began) == [] and new.exists(), held
    assert stop.remove_hydra_leftovers(began) == [str(new)]
    assert old.exists() and not new.exists()


# -- issue 69: whatever ends a job, it leaves nothing in /dev/shm or /tmp -----------------------

JOB_FILES = os.path.join(ROOT, "tests", "scripts", "job_files.py")


class FilesJob:
    """`minipar run -n 2 tests/scripts/job_files.py MODE`, read until its ranks are ready: the
    files its ranks saw made (their MPICH segment, their proxy's topology file), their pids."""

    def __init__(self, mode: str):
        cmd = [sys.executable, "-m", "minipar", "run", "-n", "2", JOB_FILES, mode]
        env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)  # fmt: skip
        self.said = ""
        while "ranks ready" not in self.said:
            line = self.proc.stdout.readline()
            assert line, f"the job ended before its ranks were ready: {self.said}"
            self.said += line
        made = [line.split() for line in self.said.splitlines() if line.startswith("MADE")]
        self.ranks = [int(words[2]) for words in made]
        self.files = sorted({path for words in made for path in words[4:]})
        kinds = {os.path.dirname(path) for path in self.files}
        assert kinds == {"/dev/shm", "/tmp"}, self.said  # a segment and a topology file, made

    def end(self, timeout: float = 60) -> str:
        self.said += self.proc.communicate(timeout=timeout)[0]
        return self.said


def _gone(pids, wait: float = 10.0) -> bool:
    end = time.monotonic() + wait
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    return not any(os.path.exists(f"/proc/{p}") for p in pids)


@pytest.mark.own_job
@pytest.mark.cold  # the ranks must be the proxy's own children, as a student's are
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig,status", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_stopped_launcher_leaves_nothing_of_its_job(sig, status):
    """SIGTERM (a batch system's, `kill`) or SIGINT (Ctrl-C) to `minipar run` mid-job: the ranks
    end with it and the job's MPICH segment and hydra's topology file are gone, while another
    job running beside it keeps its own. Before: SIGTERM ended the launcher alone, the ranks
    ran on orphaned, and both files stayed."""
    other = FilesJob("wait")
    try:
        job = FilesJob("wait")
        assert not set(job.files) & set(other.files)
        job.proc.send_signal(getattr(signal, sig))
        said = job.end()
        assert job.proc.returncode == status, said
        assert _gone(job.ranks), f"ranks outlived the launcher: {job.ranks}"
        assert [p for p in job.files if os.path.exists(p)] == [], said
        assert all(os.path.exists(p) for p in other.files), "another job's files were removed"
    finally:
        other.proc.send_signal(signal.SIGTERM)
        other.end()
    assert [p for p in other.files if os.path.exists(p)] == []


@pytest.mark.own_job
@pytest.mark.cold
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["die", "abort"])
def test_a_job_whose_rank_dies_leaves_nothing(mode):
    """A rank SIGKILLed (the kernel's OOM killer, a student's kill -9) or MPI_Abort: the job
    fails, and its segment (which no rank lived to unlink) and topology file are removed.
    A SIGKILLed rank is named by `minipar run` as the one that went first (not rank 0, which
    the MPI's launcher killed after it), whichever rank the launcher's own lines name."""
    job = FilesJob(mode)
    said = job.end(timeout=120)
    assert job.proc.returncode not in (0, None), said
    if mode == "die":
        assert "minipar run: rank 1 ended first, without exiting" in said, said
    assert _gone(job.ranks), said
    assert [p for p in job.files if os.path.exists(p)] == [], said


@pytest.mark.own_job
@pytest.mark.cold
@pytest.mark.timeout(180)
def test_a_timed_out_captured_job_leaves_nothing():
    """launcher.run(capture=True), the graders' and benchmarks' way, killed by its timeout:
    exit 124 and nothing of the job left."""
    done = launcher.run(2, [JOB_FILES, "wait"], timeout=8, capture=True)  # MADE within ~2 s
    assert done.returncode == 124, done.stdout + done.stderr
    made = [line.split() for line in done.stdout.splitlines() if line.startswith("MADE")]
    files = sorted({path for words in made for path in words[4:]})
    assert len(made) == 2 and files, done.stdout + done.stderr
    assert [p for p in files if os.path.exists(p)] == []


def test_signals_raise_terminated_and_keep_one_during_the_clean_up():
    """Inside signals_raise, SIGTERM raises Terminated (a KeyboardInterrupt: the launcher's
    Ctrl-C path); one that comes while the job's files are removed waits for the block's end;
    an ignored SIGHUP (nohup) stays ignored; the handlers are put back after."""
    from minipar.launcher.stop import Terminated, signals_raise

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as raised:
        with signals_raise():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert raised.value.signum == signal.SIGTERM and isinstance(raised.value, KeyboardInterrupt)
    cleaned = []
    with pytest.raises(Terminated):
        with signals_raise() as state:
            state["removing"] = True
            os.kill(os.getpid(), signal.SIGTERM)
            cleaned.append("done")  # not cut short
    assert cleaned == ["done"] and signal.getsignal(signal.SIGTERM) == before
    saved = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with signals_raise():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, saved)


def test_mpich_names_a_job_after_an_fnv1a_hash():
    """FNV-1a's published 32-bit values (the hash MPICH's uthash names a job's segment with)."""
    from minipar.launcher import job_files

    assert job_files.fnv1a("") == 0x811C9DC5
    assert job_files.fnv1a("a") == 0xE40C292C
    assert job_files.fnv1a("foobar") == 0xBF9CF968


def test_the_sweep_takes_a_dead_jobs_segment_never_a_mapped_one():
    """A segment of this user that some process still maps is a live job's and stays; once
    nothing maps it, the sweep (minipar doctor, the next run --nodes) removes it."""
    import mmap
    import secrets

    from minipar.launcher import job_files

    path = os.path.join(job_files.SHM_DIR, f"mpich_shm_{secrets.token_hex(4)}_0")
    try:
        with open(path, "wb+") as f:
            f.truncate(4096)
            mapped = mmap.mmap(f.fileno(), 4096)
        assert path not in job_files.stale_segments(settled=0.0)  # mapped: a live rank's
        mapped.close()
        assert path in job_files.stale_segments(settled=0.0)
        assert path not in job_files.stale_segments()  # younger than a minute: may be starting
        assert job_files.remove([path]) == [path] and not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.remove(path)
