"""The grader's wall (minipar/course/policy.py, sandbox.py, codec.py, submission.py): what a
submission may use, the process its code runs in, and what crosses back. Each attack here is a
file a cheating student could hand in; each must gain nothing. The attacks that the policy
refuses are also run past it (straight into the wall's child process) where the wall alone
must hold."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from minipar import exercises
from minipar.course import codec, policy, sandbox, submission

SOLUTIONS = exercises.tree("solutions")
EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
LONG = pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's long checks)")


def refusals(text: str, exercise: str) -> list[str]:
    solution = SOLUTIONS / f"{exercise}.py"
    return policy.check_text(textwrap.dedent(text), f"{exercise}.py",
                             policy.allowed_imports(solution))  # fmt: skip


# -- the policy: each line below names the attack it stops -----------------------------------


@pytest.mark.parametrize(
    "exercise,text,said",
    [
        ("ex03_ring_allreduce", "from minipar.collectives.ring import all_reduce_ring", "ring"),
        ("ex03_ring_allreduce", "import minipar\nminipar.all_reduce", "import minipar"),
        ("ex03_ring_allreduce", "from mpi4py import MPI", "mpi4py"),
        ("ex03_ring_allreduce", "def f(call, x):\n    call.comm.Allreduce(x)", ".comm"),
        ("ex10_moe_dispatch", "import minipar.cli.grade as g", "minipar.cli.grade"),
        ("ex10_moe_dispatch", "import atexit", "atexit"),
        ("ex10_moe_dispatch", "import os\nos._exit(0)", "import os"),
        ("ex10_moe_dispatch", "exec(open('solutions/ex10_moe_dispatch.py').read())", "open"),
        ("ex10_moe_dispatch", "x = ().__class__.__base__.__subclasses__()", ".__class__"),
        ("ex10_moe_dispatch", "f = getattr(torch, 'lo' + 'ad')", "getattr"),
        ("ex10_moe_dispatch", "import torch\ntorch.load('x')", ".load"),
        ("ex10_moe_dispatch", "import torch\ntorch.distributed.all_reduce(t)", ".distributed"),
        ("ex10_moe_dispatch", "import numpy as np\nnp.savetxt('results.json', [1])", ".savetxt"),
        ("ex10_moe_dispatch", "s = '{0.__class__}'.format(1)", "'__'"),
        ("ex10_moe_dispatch", "from . import dispatch", "relative import"),
        ("ex10_moe_dispatch", "__import__('os')", "__import__"),
        (
            "ex05_naive_ddp",
            "import minipar\nminipar.exercises.load('x', 'solutions')",
            ".exercises",
        ),
    ],
)
def test_policy_refuses_each_attack_naming_file_and_line(exercise, text, said):
    found = refusals(text, exercise)
    assert found, f"{text!r} was admitted for {exercise}"
    assert found[0].startswith(f"{exercise}.py:"), found[0]
    assert said in " ".join(found), found


def test_policy_admits_every_worked_answer_and_every_stub():
    for folder in (SOLUTIONS, exercises.tree("exercises")):
        for path in sorted(folder.glob("ex[0-9][0-9]_*.py")):
            assert policy.check(path, path.stem, SOLUTIONS) == [], path.name


def test_policy_names_a_syntax_error_with_its_line():
    found = refusals("def f(:\n    pass\n", "ex12_checkpoint_interval")
    assert found == [
        "ex12_checkpoint_interval.py:1: SyntaxError: invalid syntax (the file does not parse)"
    ] or found[0].startswith("ex12_checkpoint_interval.py:1: Syntax")


def test_policy_lets_a_docstring_mention_dunders_and_an_exercise_its_own_imports():
    text = (
        '''"""Uses __init__ in prose."""\nimport math\nfrom minipar.collectives import layout\n'''
    )
    assert refusals(text, "ex03_ring_allreduce") == []
    assert refusals("import math\nimport torch", "ex12_checkpoint_interval") == []


# -- submissions: nested uploads, refused files --------------------------------------------------


def test_a_nested_upload_is_flattened_and_a_refused_file_raises_its_refusal(tmp_path):
    upload = tmp_path / "upload"
    (upload / "deep" / "er").mkdir(parents=True)
    (upload / "__MACOSX").mkdir()
    (upload / "deep" / "er" / "ex12_checkpoint_interval.py").write_text("import os\n")
    (upload / "__MACOSX" / "ex10_moe_dispatch.py").write_text("junk")
    (upload / "deep" / "ex11_nccl_rings.py").write_text("x = 1\n")
    (upload / "notes_ex11.py").write_text("")
    found = submission.files(upload, {"ex12_checkpoint_interval", "ex11_nccl_rings"})
    assert sorted(found) == ["ex11_nccl_rings", "ex12_checkpoint_interval"]
    scratch = tmp_path / "scratch"
    refused = submission.admit(found, scratch, SOLUTIONS)
    assert list(refused) == ["ex12_checkpoint_interval"]
    assert (scratch / "ex11_nccl_rings.py").read_text() == "x = 1\n"
    stand_in = (scratch / "ex12_checkpoint_interval.py").read_text()
    assert "import os" in stand_in and stand_in.startswith("raise ImportError(")
    assert oct(scratch.stat().st_mode & 0o777) == "0o755"


# -- the codec: values, never code ---------------------------------------------------------------


def test_codec_carries_arrays_tensors_floats_and_instructions_exactly():
    import torch

    from minipar.parallel.pipeline import schedules as S

    value = {
        "a": np.arange(6, dtype=np.int32).reshape(2, 3),
        "t": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "b": torch.tensor([True, False]),
        "f": (float("inf"), float("-inf"), 0.1),
        "i": [S.Forward(3), S.Backward(1, chunk=2)],
        "g": (x for x in range(3)),
    }
    back = codec.decode(json.loads(json.dumps(codec.encode(value))))
    assert back["a"].dtype == np.int32 and np.array_equal(back["a"], value["a"])
    assert back["t"].dtype == torch.bfloat16 and torch.equal(back["t"], value["t"])
    assert back["b"].dtype == torch.bool and back["b"].tolist() == [True, False]
    assert back["f"] == (float("inf"), float("-inf"), 0.1)
    assert back["i"] == [S.Forward(3), S.Backward(1, chunk=2)] and back["g"] == [0, 1, 2]


def test_codec_refuses_what_it_cannot_read_by_name():
    with pytest.raises(codec.CodecError, match="function"):
        codec.encode(lambda: 0)
    with pytest.raises(codec.CodecError, match="not a value"):
        codec.decode({"pickle": "gASV..."})
    with pytest.raises(codec.CodecError, match="instruction"):
        codec.decode({"instruction": "Popen", "fields": {}})


# -- the wall alone: what a file does when nothing checked it -------------------------------------


@pytest.fixture
def tmp_open():
    """A temporary folder others may read (the wall's child may run as `nobody`; pytest's
    tmp_path sits under a folder only its owner may enter)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="minipar-wall-test-") as folder:
        os.chmod(folder, 0o755)
        yield Path(folder)


def walled(tmp_path, text: str, name: str = "ex12_checkpoint_interval", hide=(), timeout=None):
    folder = tmp_path / "sub"
    folder.mkdir(exist_ok=True)
    os.chmod(folder, 0o755)
    (folder / f"{name}.py").write_text(textwrap.dedent(text))
    os.chmod(folder / f"{name}.py", 0o644)
    os.environ[sandbox.HIDE_ENV] = os.pathsep.join(str(h) for h in hide)
    try:
        wall = sandbox.Wall(str(folder), timeout=timeout)
        return wall, sandbox.SealedModule(wall, name)
    finally:
        del os.environ[sandbox.HIDE_ENV]


def test_wall_returns_values_and_raises_the_students_error_by_type(tmp_open):
    tmp_path = tmp_open
    wall, mod = walled(
        tmp_path,
        """
        def best_interval(save_s, mtbi_s):
            return (2 * save_s * mtbi_s) ** 0.5
        def waste(*args):
            raise ValueError("bad interval 7")
        LIMIT = 3
    """,
    )
    try:
        assert mod.best_interval(8.0, 4.0) == 8.0
        assert mod.LIMIT == 3
        with pytest.raises(ValueError, match="bad interval 7"):
            mod.waste(1, 2, 3, 4)
        assert sys.modules.get("minipar_sub_ex12_checkpoint_interval") is None  # not here
    finally:
        wall.close()


def test_wall_an_exit_fails_the_call_and_the_next_call_runs_again(tmp_open):
    tmp_path = tmp_open
    wall, mod = walled(
        tmp_path,
        """
        import os
        def best_interval(save_s, mtbi_s):
            os._exit(0)
        def waste(*args):
            return 1.0
    """,
    )
    try:
        with pytest.raises(RuntimeError, match="ended its process \\(exit status 0\\)"):
            mod.best_interval(1.0, 2.0)
        assert mod.waste(1, 2, 3, 4) == 1.0
    finally:
        wall.close()


def test_wall_a_hang_fails_in_its_time_and_names_the_line(tmp_open):
    tmp_path = tmp_open
    wall, mod = walled(
        tmp_path,
        """
        def best_interval(save_s, mtbi_s):
            while True:
                pass
    """,
        timeout=1.5,
    )
    start = time.monotonic()
    try:
        with pytest.raises(
            TimeoutError, match=r"within 1.5 s.*ex12_checkpoint_interval.py.*line [34] "
        ):
            mod.best_interval(1.0, 2.0)
    finally:
        wall.close()
    assert time.monotonic() - start < 6


def test_wall_hides_the_answers_and_the_results_and_starts_no_process(tmp_open):
    tmp_path = tmp_open
    secret = tmp_path / "answers"
    secret.mkdir()
    (secret / "ex12_checkpoint_interval.py").write_text("ANSWER = 42\n")
    results = tmp_path / "results.json"
    results.write_text("{}")
    wall, mod = walled(
        tmp_path,
        f"""
        import subprocess
        def read():
            return open({str(secret / "ex12_checkpoint_interval.py")!r}).read()
        def write():
            open({str(results)!r}, "w").write('{{"score": 999}}')
        def spawn():
            return subprocess.run(["true"]).returncode
    """,
        hide=(secret, results),
    )
    try:
        for attack in (mod.read, mod.write, mod.spawn):
            with pytest.raises(RuntimeError, match="PermissionError"):
                attack()
    finally:
        wall.close()
    assert results.read_text() == "{}"


# -- the whole grader, in one command: attacks beside honest work -------------------------------


@pytest.mark.slow  # CI's long checks only (MINIPAR_EXTENDED=1)
def test_grade_attacks_gain_nothing_and_honest_work_keeps_its_points(tmp_path):
    """One `minipar grade --impl` run over a submission where each exercise holds another
    attack; the results file is the grader's and the exit status says not all passed."""
    sub = tmp_path / "sub" / "nested"
    sub.mkdir(parents=True)
    attacks = {
        "ex10_moe_dispatch": "from minipar.parallel.expert.dispatch import *\n",
        "ex11_nccl_rings": "import minipar.cli.grade as g\ng.Result = None\n",
        "ex09_online_softmax_merge": "import os\nos._exit(0)\n",
        "ex07_one_f_one_b": "exec(open('solutions/ex07_one_f_one_b.py').read())\n",
        "ex04_alpha_beta_fit": "import atexit\natexit.register(print)\n",
    }
    for name, text in attacks.items():
        (sub / f"{name}.py").write_text(text)
    (sub / "ex12_checkpoint_interval.py").write_text(
        (SOLUTIONS / "ex12_checkpoint_interval.py").read_text())  # fmt: skip
    spin = (SOLUTIONS / "ex02_broadcast_linear.py").read_text().replace(
        "    if call.rank == root:\n", "    while call.rank == 1:\n        pass\n"
        "    if call.rank == root:\n", 1)  # fmt: skip
    assert "while call.rank == 1" in spin
    (sub / "ex02_broadcast_linear.py").write_text(spin)  # a rank that never returns
    out = tmp_path / "results.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MINIPAR_GRADE_CASE_LIMIT": "4"}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "minipar", "grade", "--impl", str(tmp_path / "sub"), "--format",
         "gradescope", "--json", str(out)],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    seconds = time.monotonic() - start
    assert done.returncode == 1, done.stderr[-2000:]
    results = json.loads(out.read_text())
    by = {}
    for test in results["tests"]:
        by.setdefault(test["tags"][0], []).append(test)
    for name in attacks:
        assert sum(t["score"] for t in by[name]) == 0, (name, by[name][:1])
        assert f"{name}.py:" in by[name][0]["output"], by[name][0]["output"]
    honest = by["ex12_checkpoint_interval"]
    assert all(t["status"] == "passed" for t in honest) and sum(t["score"] for t in honest) == 10
    assert all(t["score"] == 0 for t in by["ex03_ring_allreduce"])  # not submitted: 0 of 25
    spun = by["ex02_broadcast_linear"]
    assert sum(t["score"] for t in spun) == 0, spun  # its 1-rank cases pass, and are worth 0
    hung = next(t for t in spun if t["status"] == "failed")["output"]
    loop = spin.splitlines().index("    while call.rank == 1:") + 1  # the loop's two lines
    assert re.search(
        f"rank 1 did not return within 4 s \\(hung\\): at ex02_broadcast_linear.py:"
        f"({loop}|{loop + 1}) in broadcast_linear; ranks \\[0\\] waited",
        hung,
    ), hung
    assert seconds < 120, f"the hang took {seconds:.0f} s of the grade"
    assert sum(t["max_score"] for t in results["tests"]) == pytest.approx(295)
    assert results["score"] == pytest.approx(10)


# -- a class: every submission graded apart, the gradebook, the similarity ---------------------


@LONG
def test_a_class_is_graded_into_results_a_gradebook_and_a_similarity_report(tmp_path):
    """Three students (a folder, a nested .zip, a copy of the first), a fourth on the roster
    only, an assignment of two one-process exercises (10 + 20 points): each graded apart."""
    import csv
    import zipfile

    ups = tmp_path / "uploads"
    for who in ("alice", "carol"):
        (ups / who).mkdir(parents=True)
        for name in ("ex12_checkpoint_interval", "ex11_nccl_rings"):
            (ups / who / f"{name}.py").write_text((SOLUTIONS / f"{name}.py").read_text())
    with zipfile.ZipFile(ups / "bob.zip", "w") as archive:  # an upload nested in folders
        archive.writestr(
            "work/hw/ex12_checkpoint_interval.py",
            (exercises.tree("exercises") / "ex12_checkpoint_interval.py").read_text(),
        )
        archive.writestr("work/hw/ex11_nccl_rings.py", "import os\n")  # fmt: skip
    points = tmp_path / "points.toml"
    points.write_text("default = 5\n[points]\nex12_checkpoint_interval = 10\nex11_nccl_rings = 20\n"
                      "[visibility]\nex11_nccl_rings = \"after_due_date\"\n")  # fmt: skip
    roster = tmp_path / "roster.csv"
    roster.write_text("email,name\na@x,alice\nb@x,bob\nc@x,carol\nd@x,dave\n")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "minipar", "grade", "--submissions", str(ups), "--out", str(out),
         "--points", str(points), "--roster", str(roster), "--jobs", "2"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]  # bob did not pass everything
    assert "[3/3]" in done.stderr and "left)" in done.stderr, done.stderr
    rows = {r["student"]: r for r in csv.DictReader(open(out / "grades.csv"))}
    assert set(rows) == {"alice", "bob", "carol", "dave"}
    assert rows["alice"]["total"] == "30" and rows["alice"]["max"] == "30"
    assert rows["bob"]["ex11_nccl_rings"] == "0" and rows["bob"]["ex12_checkpoint_interval"] == "0"
    assert rows["dave"]["status"] == "no submission" and rows["dave"]["total"] == "0"
    bob = json.loads((out / "bob" / "results.json").read_text())
    ex11 = [t for t in bob["tests"] if t["tags"] == ["ex11_nccl_rings"]]
    assert ex11 and all(t["visibility"] == "after_due_date" for t in ex11)
    assert "ex11_nccl_rings.py:1: import os" in ex11[0]["output"]
    report = (out / "similarity.md").read_text()
    assert "| 100% | ex11_nccl_rings | alice | carol |" in report, report
    assert "| alice | worked answer |" in report


@LONG
def test_the_gradescope_bundle_grades_a_submission_in_a_made_up_autograder_tree(tmp_path):
    """`minipar course autograder` writes the zip; unpacked as Gradescope does, its
    run_autograder grades /autograder/submission into /autograder/results/results.json."""
    import zipfile

    bundle = tmp_path / "autograder.zip"
    points = tmp_path / "two.toml"
    points.write_text("[points]\nex12_checkpoint_interval = 10\nex11_nccl_rings = 5\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "minipar",
            "course",
            "autograder",
            str(bundle),
            "--points",
            str(points),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as archive:
        names = archive.namelist()
        archive.extractall(root / "source")
    assert {"setup.sh", "run_autograder", "two.toml", "solutions/points.toml"} <= set(names)
    assert "tests/test_exercises.py" in names and "minipar/cli/grade.py" in names
    (root / "submission" / "hw").mkdir(parents=True)  # Gradescope keeps the upload's folders
    (root / "submission" / "hw" / "ex12_checkpoint_interval.py").write_text(
        (SOLUTIONS / "ex12_checkpoint_interval.py").read_text())  # fmt: skip
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    results = json.loads((root / "results" / "results.json").read_text())
    assert done.returncode == 0, done.stderr[-2000:]  # some failed: still a grade, exit 0 here
    assert results["score"] == pytest.approx(10), [t["output"][:300] for t in results["tests"]]
    assert results["output"].endswith("of 15 points")
    assert any("no ex11_nccl_rings.py in the submission" in t["output"] for t in results["tests"])


@pytest.mark.parametrize(
    "exercise,text,said",
    [
        ("ex03_ring_allreduce", "from minipar.comm.transport import buffers\nbuffers.sys.exit(0)",
         "buffers.sys: a module reached through"),
        ("ex03_ring_allreduce", "from minipar.comm.transport import buffers\nb = buffers\n",
         "buffers: a module used other than by its attributes"),
        ("ex05_naive_ddp", "import minipar\nminipar.collectives.ring.all_reduce_ring(c, x, o)",
         "minipar.collectives: a module reached through minipar"),
        ("ex05_naive_ddp", "import minipar\nminipar.comm.MPI", ".comm"),
    ],
)  # fmt: skip
def test_policy_a_module_of_the_list_reaches_no_other(exercise, text, said):
    assert said in " ".join(refusals(text, exercise)), refusals(text, exercise)
    assert refusals("import minipar\nminipar.all_reduce(x, group=g)\n", "ex05_naive_ddp") == []


@LONG
def test_hidden_tests_run_beside_ours_after_the_due_date_and_out_of_the_students_reach(tmp_path):
    """--hidden-tests DIR: the instructor's own tests of an exercise count toward its points,
    Gradescope shows them after the due date, and the graded code cannot open them."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "test_more.py").write_text(
        textwrap.dedent("""\
        import math

        from minipar.course import sandbox


        def test_ex12_checkpoint_interval_secret_square_root():
            mod = sandbox.graded("ex12_checkpoint_interval")
            assert math.isclose(mod.best_interval(8.0, 50.0), 4 * mod.best_interval(0.5, 50.0))
    """)
    )
    sub = tmp_path / "sub"
    sub.mkdir()
    root = "    return math.sqrt(2 * save_s * mtbi_s)\n"
    linear = (SOLUTIONS / "ex12_checkpoint_interval.py").read_text()
    linear = linear.replace(root, "    return 2 * save_s * mtbi_s\n")
    (sub / "ex12_checkpoint_interval.py").write_text(linear)
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "minipar", "grade", "--impl", str(sub), "ex12", "--format",
         "gradescope", "--json", str(out), "--hidden-tests", str(secret)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    tests = {t["name"]: t for t in json.loads(out.read_text())["tests"]}
    hidden = tests["ex12_checkpoint_interval: secret_square_root"]
    assert hidden["status"] == "failed" and hidden["visibility"] == "after_due_date"
    assert tests["ex12_checkpoint_interval: mtbi_from_llama3"]["visibility"] == "visible"
    assert hidden["max_score"] == pytest.approx(10 / 6)  # ex12's 10 points over 6 tests now


@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's long checks: 4 world sizes)")
def test_a_syntax_error_costs_its_own_exercise_only_and_names_its_line(tmp_path):
    """Issue 71, item 6: a broken ex03_ring_allreduce.py once failed the correct
    ex03_recursive_doubling's plugs-into-minipar tests (register() loaded every file) and said
    "SyntaxError: expected ':'" with no file or line; the tests never run were counted failed."""
    sub = tmp_path / "sub"
    sub.mkdir()
    ring = (SOLUTIONS / "ex03_ring_allreduce.py").read_text()
    broken = ring.replace(
        "    for s in call.rounds(p - 1):\n", "    for s in call.rounds(p - 1)\n", 1
    )
    line = broken.splitlines().index("    for s in call.rounds(p - 1)") + 1
    (sub / "ex03_ring_allreduce.py").write_text(broken)
    (sub / "ex03_recursive_doubling.py").write_text(
        (SOLUTIONS / "ex03_recursive_doubling.py").read_text())  # fmt: skip
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "minipar", "grade", "--impl", str(sub), "03", "--json", str(out)],
        capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    results = json.loads(out.read_text())
    mine = [r for r in results if r["exercise"] == "ex03_recursive_doubling"]
    assert mine and all(r["status"] == "passed" for r in mine), [r for r in mine if r["detail"]]
    ring_results = [r for r in results if r["exercise"] == "ex03_ring_allreduce"]
    assert f"ex03_ring_allreduce.py:{line}: SyntaxError" in ring_results[0]["detail"]
    said = " ".join(done.stdout.split())
    not_run = sum(r["detail"].startswith("not run") for r in ring_results)
    assert not_run and f"{not_run} not run" in said, said[-400:]
    assert f"1 failed, {not_run} not run" in said or "1 failed" in said


def test_wall_a_file_that_hangs_as_it_loads_fails_once_not_at_every_test(tmp_open, monkeypatch):
    monkeypatch.setattr(sandbox, "LOAD_TIMEOUT", 1.0)
    wall, _ = walled(tmp_open, "while True:\n    pass\n", timeout=1.0)
    try:
        for _ in range(3):
            start = time.monotonic()
            with pytest.raises(TimeoutError, match="loading the file did not return within 1 s"):
                wall.call("ex12_checkpoint_interval", {"get": None})
            took = time.monotonic() - start
        assert took < 0.5, f"the third load waited {took:.1f} s again"
    finally:
        wall.close()


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace of its own: root")


@ROOT_ONLY
def test_apart_covers_the_hidden_paths_and_drops_roots_powers(tmp_open):
    from minipar import exercises as facade

    answers, results = tmp_open / "answers", tmp_open / "results.json"
    answers.mkdir()
    (answers / "ex03.py").write_text("ANSWER")
    results.write_text("{}")
    prefix = facade.apart([str(answers), str(results), str(tmp_open / "absent")])
    if not facade.runs(prefix):
        pytest.skip("this machine refuses a mount namespace here")
    probe = textwrap.dedent(f"""\
        import os, subprocess
        print(os.listdir({str(answers)!r}), repr(open({str(results)!r}).read()))
        open({str(results)!r}, "w").write("full marks")
        print(subprocess.run(["umount", {str(answers)!r}], capture_output=True).returncode)
        print(open("/proc/self/status").read().split("CapEff:")[1].split()[0])
    """)
    done = subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    listed, umount, caps = done.stdout.splitlines()
    assert listed == "[] ''" and umount != "0" and int(caps, 16) == 0, done
    assert results.read_text() == "{}" and (answers / "ex03.py").read_text() == "ANSWER"


@ROOT_ONLY
def test_while_grading_the_fork_server_of_the_ranks_runs_apart(tmp_open, monkeypatch):
    """The pool's fork server (testing/zygote.py) forks every rank of a grade: under
    MINIPAR_GRADE_COVER it starts covered and without root's capabilities."""
    from minipar.testing import zygote

    results = tmp_open / "results.json"
    results.write_text("{}")
    monkeypatch.setenv("MINIPAR_GRADE_COVER", str(results))
    server = zygote.Server(dict(os.environ))
    try:
        if not server.ready(60):
            pytest.skip(f"no fork server here: {server.error}")
        status = open(f"/proc/{server.proc.pid}/status").read()
        caps = int(status.split("CapEff:")[1].split()[0], 16)
        assert caps == 0 or not zygote._apart(), status[:300]
    finally:
        server.close()
