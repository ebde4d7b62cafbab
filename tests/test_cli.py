"""The `minipar` command: help, `run`, `doctor`, and how light `import minipar` is."""

import ast
import importlib
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minipar import cli

HEAVY = ("torch", "numpy", "mpi4py")


def minipar(*args, timeout=90):
    """Run `python -m minipar ARGS` (what the console script runs); return the CompletedProcess."""
    cmd = [sys.executable, "-m", "minipar", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def script(tmp_path, body: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


# -- help -------------------------------------------------------------------------------------


def test_top_level_help_lists_the_commands():
    done = minipar("--help")
    assert done.returncode == 0, done.stderr
    for name in ("run", "doctor", "tour"):
        assert f"    {name} " in done.stdout
    assert "examples:" in done.stdout


@pytest.mark.parametrize("name", [n for n in cli.COMMANDS if cli.available(n)])
def test_each_command_help_shows_examples(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([name, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: minipar {name}" in out
    assert "example" in out.lower(), f"`minipar {name} --help` shows no examples"


def test_help_imports_no_torch_numpy_or_mpi():
    code = (
        "import sys; from minipar import cli; cli.build_parser().format_help(); "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- layering: the library never imports the face -----------------------------------------------


def _imports_of(tree, package: str):
    """(line, module) for each module an `ast` tree imports, relative imports resolved against
    `package`; `from X import a, b` counts as X.a and X.b too (a submodule may be imported so)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            yield node.lineno, base
            yield from ((node.lineno, f"{base}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant):
                yield node.lineno, str(node.args[0].value)


def _is_cli(name: str) -> bool:
    return name == "minipar.cli" or name.startswith("minipar.cli.")


def test_no_library_module_imports_the_cli():
    """Every module of minipar outside minipar/cli/ (comm, collectives, parallel, models, cost,
    planner, lessons, bench, testing, ...) leaves the face alone: no `import minipar.cli`,
    `from minipar import cli`, `from minipar.cli... import`, relative forms included."""
    root = Path(cli.__file__).parent.parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        if rel.parts[1] == "cli" or rel.as_posix() == "minipar/__main__.py":
            continue  # the face itself, and `python -m minipar`, its entry point
        package = ".".join(rel.parts[:-1])  # what a relative import in this file starts from
        text = path.read_text()
        if "cli" not in text:  # no spelling of the import can hide without these letters
            continue
        for line, name in _imports_of(ast.parse(text, str(path)), package):
            if _is_cli(name):
                found.append(f"{rel}:{line} imports {name}")
    assert not found, "the library imports the command line:\n" + "\n".join(found)


def test_import_scan_sees_every_spelling():
    """The scan above catches each way of writing the import (so its silence means something)."""
    spellings = [
        ("import minipar.cli", "minipar"),
        ("import minipar.cli.plan as p", "minipar.models"),
        ("from minipar import cli", "minipar.models"),
        ("from minipar.cli import grade", "minipar"),
        ("from minipar.cli.train import main", "minipar"),
        ("from . import cli", "minipar"),
        ("from .cli import run", "minipar"),
        ("from ..cli import lesson", "minipar.course"),
        ("from ... import cli", "minipar.parallel.tensor"),
        ("importlib.import_module('minipar.cli.tour')", "minipar"),
    ]
    for code, package in spellings:
        names = [name for _, name in _imports_of(ast.parse(code), package)]
        assert any(_is_cli(n) for n in names), code
    assert not any(_is_cli(n) for _, n in _imports_of(ast.parse("from . import clip"), "minipar"))


def test_every_command_is_a_cli_module_with_configure_and_main():
    for name, (module_name, summary) in cli.COMMANDS.items():
        assert module_name == f"minipar.cli.{name}", f"{name} lives in {module_name}"
        module = importlib.import_module(module_name)
        assert callable(getattr(module, "configure", None)), f"{module_name} has no configure"
        assert callable(getattr(module, "main", None)), f"{module_name} has no main"
        assert summary


def test_missing_command_module_is_a_clear_message_and_spares_the_others(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "ghost", ("minipar.no_such_module", "not written yet"))
    assert cli.main(["ghost"]) == 2
    assert "minipar.no_such_module is missing" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    assert "ghost" not in capsys.readouterr().out  # not offered while it does not exist


def test_broken_command_module_is_reported_not_raised(monkeypatch, tmp_path, capsys):
    (tmp_path / "broken_command.py").write_text("raise RuntimeError('half-written')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "broken", ("broken_command", "a module that fails"))
    assert cli.main(["broken"]) == 2
    assert "half-written" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 0
    assert "usage: minipar" in capsys.readouterr().out


# -- run --------------------------------------------------------------------------------------


@pytest.mark.own_job
def test_run_two_ranks_exit_zero_and_both_ranks_speak(tmp_path):
    path = script(
        tmp_path,
        """
        import sys
        import numpy as np
        import minipar
        comm = minipar.init()
        got = np.zeros(1, dtype=np.int64)
        comm.sendrecv(np.array([comm.rank]), (comm.rank + 1) % 2, got, (comm.rank + 1) % 2)
        print(f"rank {comm.rank} of {comm.size} got {got[0]} argv {sys.argv[1:]}", flush=True)
        minipar.finalize()
        """,
    )
    done = minipar("run", "-n", "2", "--", path, "-n", "7", "--flag")
    assert done.returncode == 0, done.stderr
    assert "rank 0 of 2 got 1 argv ['-n', '7', '--flag']" in done.stdout
    assert "rank 1 of 2 got 0 argv ['-n', '7', '--flag']" in done.stdout


@pytest.mark.own_job
def test_run_module_on_four_ranks():
    done = minipar("run", "-n", "4", "-m", "minipar.course.demos.smoke")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.split("MINIPAR_SMOKE ", 1)[1].splitlines()[0])
    assert facts["size"] == 4 and facts["ring_ok"] and facts["all_reduce_ok"]


@pytest.mark.own_job
def test_failing_rank_gives_nonzero_exit_quickly(tmp_path):
    path = script(
        tmp_path,
        """
        import time
        import minipar
        comm = minipar.init()
        if comm.rank == 1:
            raise RuntimeError("rank one fails on purpose")
        time.sleep(60)  # the others would wait; the abort must end them
        """,
    )
    start = time.monotonic()
    done = minipar("run", "-n", "3", "--timeout", "45", path)
    assert done.returncode not in (0, 124), done.stderr
    assert time.monotonic() - start < 30
    assert "rank one fails on purpose" in done.stderr
    assert "job exited with status" in done.stderr


@pytest.mark.own_job
def test_timeout_kills_a_hung_job(tmp_path):
    path = script(tmp_path, "import time\ntime.sleep(120)\n")
    start = time.monotonic()
    done = minipar("run", "-n", "2", "--timeout", "3", path)
    assert done.returncode == 124
    assert time.monotonic() - start < 20
    assert "killed after 3 s" in done.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "-n", "2"], "nothing to run"),
        (["run", "-n", "2", "no_such_script.py"], "no such script"),
        (["run", "-n", "0", "-m", "json.tool"], "positive integer"),
        (["run", "-n", "2", "-m", "json.tool", "extra.py"], None),  # extra.py goes to the module
    ],
)
def test_run_bad_arguments(args, message, capsys):
    if message is None:  # not an error: what follows -m belongs to the module
        ns = cli.build_parser("run").parse_args(args)
        assert ns.module == ["json.tool", "extra.py"] and ns.argv == []
        return
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err


def test_run_dry_run_prints_mpiexec_line(capsys):
    assert cli.main(["run", "-n", "3", "--dry-run", "-m", "minipar.course.demos.smoke"]) == 0
    line = capsys.readouterr().out.strip()
    assert "mpiexec" in line and "-n 3" in line and line.endswith("-m minipar.course.demos.smoke")


# -- doctor -----------------------------------------------------------------------------------


@pytest.mark.own_job
def test_doctor_json_says_minipar_can_run():
    # the smoke job's own limit well inside the test's, so a slow host reports, not hangs
    done = minipar("doctor", "--json", "--timeout", "60", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] is True
    for name in ("MPI library", "mpiexec", "CUDA-aware MPI", "torch", "gloo", "cores"):
        assert name in checks, f"doctor does not report {name}"
    assert checks["2-rank smoke job"]["value"] == "passed"
    assert checks["thread level"]["value"] == "MPI_THREAD_MULTIPLE"
    assert checks["CUDA-aware MPI"]["value"] in ("yes", "no") and checks["CUDA-aware MPI"]["note"]


def test_doctor_table_and_verdict_render():
    from rich.console import Console

    from minipar.cli import doctor

    report = {"ok": False, "checks": [
        {"name": "mpiexec", "value": "not found", "status": "fail", "note": "pip install mpich"},
        {"name": "torch", "value": "2.x", "status": "ok", "note": ""},
    ]}  # fmt: skip
    console = Console(record=True, width=100)
    console.print(doctor.table(report))
    console.print(doctor.verdict(report))
    text = console.export_text()
    assert "FAIL" in text and "pip install mpich" in text
    assert "cannot run here yet: fix mpiexec" in text


# -- import minipar -----------------------------------------------------------------------------


def test_import_minipar_is_light_and_fast():
    """No torch, numpy or mpi4py at import; the import itself well under 0.3 s (the best of 3
    runs, timed inside the interpreter so a loaded machine's slow start-up does not count)."""
    code = (
        "import sys, time; start = time.perf_counter(); import minipar; "
        "seconds = time.perf_counter() - start; "
        f"print(seconds, [m for m in {HEAVY!r} if m in sys.modules])"
    )
    seconds = []
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        took, heavy = done.stdout.split(" ", 1)
        assert heavy.strip() == "[]", f"import minipar pulled in {heavy.strip()}"
        seconds.append(float(took))
    assert min(seconds) < 0.3, f"import minipar took {min(seconds):.3f} s"


# -- bad input answered at once (issue 56) ----------------------------------------------------
BAD_INPUT = """
import contextlib, io, json, sys
from minipar import cli
said = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            status = cli.main(argv)
        except SystemExit as end:
            status = end.code
    said.append([status, out.getvalue(), "torch" in sys.modules])
print(json.dumps(said))
"""


def test_bad_input_is_refused_before_anything_starts_naming_the_flag():
    """Each refused in one or two lines, by its flag, with the choices where there are some,
    before any rank starts or torch loads (`--clip -1` was refused by the ranks after 8.8 s,
    `--dtype fp8` after 18 lines of usage, `--algorithms ringz` with no list)."""
    cases = [
        (["train", "--clip", "-1"], ["--clip must be a positive number, got -1.0"]),
        (["train", "--dp", "3", "--tp", "2", "--pp", "2"],
         ["--batch-size 8 is not divisible by --dp 3 x --microbatches 1",
          "--batch-size 9 would do"]),
        (["train", "--dtype", "fp8"], ["--dtype", "'fp8'", "'fp32', 'bf16', 'fp16'"]),
        (["train", "--tp", "3"], ["--heads 8 is not divisible by --tp 3"]),
        (["train", "--min-lr", "5"], ["--min-lr 5.0 must lie in 0 .. --lr 0.001"]),
        (["train", "--resume", "no_such.pt"], ["--resume no_such.pt: no such file"]),
        (["train", "--json", "no_such_folder/x.json"],
         ["--json no_such_folder/x.json: no folder", "no_such_folder to write it in"]),
        (["run", "--timeout", "-1", "-n", "2", "job.py"], ["--timeout -1: give a positive"]),
        (["simulate", "all_reduce", "--algorithms", "ring,ringz"],
         ["--algorithms: no all_reduce algorithm named 'ringz'; choose from",
          "ring", "tree", "double_tree", "hierarchical", "rings"]),
    ]  # fmt: skip
    argvs = json.dumps([argv for argv, _ in cases])
    done = subprocess.run([sys.executable, "-c", BAD_INPUT, argvs], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for (argv, words), (status, text, torch_loaded) in zip(cases, json.loads(done.stdout)):
        flat = " ".join(text.split())  # rich wraps at 80 columns off a terminal
        assert status == 2, (argv, text)
        assert all(w in flat for w in words), (argv, text)
        assert len(text.strip().splitlines()) <= 2 and "usage:" not in text, (argv, text)
        assert not torch_loaded, argv


# -- doctor on a machine without a GPU (issue 56) ---------------------------------------------
def test_doctor_says_what_is_true_without_a_gpu():
    """No CUDA device: the tensor path says so and what would happen on one; NCCL built into
    torch is not called available where it cannot run."""
    import torch

    from minipar.cli import doctor
    from minipar.comm.transport import staging

    chunk = staging.chunk_bytes() >> 10
    aware = doctor.Check("CUDA-aware MPI", "no")
    none = [aware, doctor.Check("CUDA devices", "none")]
    (path,) = doctor.path_checks(none)
    assert path.value == "none here (no CUDA device)", path
    assert path.note.startswith(f"on a GPU: staged, pipelined above {chunk} KiB"), path
    (path,) = doctor.path_checks([aware, doctor.Check("CUDA devices", "1 x NVIDIA H100")])
    assert path.value == f"staged, pipelined above {chunk} KiB", path
    built_only = doctor.nccl_check(True, False)
    assert built_only.value == "built in, unusable here" and "no CUDA" not in built_only.value
    assert "needs a CUDA device" in built_only.note and "gloo" in built_only.note
    assert doctor.nccl_check(True, True).value == "available"
    here = {c.name: c for c in doctor.torch_checks()}
    if not torch.cuda.is_available():  # this machine, as doctor reports it
        assert here["CUDA devices"].value == "none" and here["nccl"].value != "available"
