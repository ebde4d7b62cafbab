"""Exercises are generated from solutions and kept in sync; the grader passes the solutions and
reports every untouched exercise as not started (NotImplementedError, nothing else)."""

import json
import subprocess

import pytest
from conftest import warm_python

from minipar.cli import grade
from minipar.course import exercises

SAMPLE = '''\
def f(x):
    """Doc."""
    y = 1
    # BEGIN SOLUTION hint: add "one"
    # hint: then return it
    return x + y
    # END SOLUTION


def g():
    # BEGIN SOLUTION
    pass
    # END SOLUTION
'''


def test_strip_replaces_each_block_with_its_hint():
    text, blocks = exercises.strip(SAMPLE)
    assert blocks == 2
    assert '    raise NotImplementedError("add \\"one\\" then return it")' in text
    assert f'    raise NotImplementedError("{exercises.NO_HINT}")' in text
    assert "return x + y" not in text and "pass" not in text
    assert "    y = 1" in text  # what is outside the markers stays
    namespace = {}
    exec(compile(text, "exercise", "exec"), namespace)
    with pytest.raises(NotImplementedError, match='add "one" then return it'):
        namespace["f"](1)


@pytest.mark.parametrize(
    "bad,message",
    [
        ("# BEGIN SOLUTION\nx = 1\n", "never closed"),
        ("x = 1\n# END SOLUTION\n", "without a BEGIN"),
        ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "inside the block"),
    ],
)
def test_strip_refuses_broken_markers(bad, message):
    with pytest.raises(ValueError, match=message):
        exercises.strip(bad)


def test_long_hints_wrap_to_fit_the_line():
    text, _ = exercises.strip(
        "    # BEGIN SOLUTION hint: " + "word " * 60 + "\n    # END SOLUTION\n"
    )
    assert all(len(line) <= 100 for line in text.splitlines())
    namespace = {}
    exec(compile("def f():\n" + text, "exercise", "exec"), namespace)
    with pytest.raises(NotImplementedError, match="word word"):
        namespace["f"]()


def test_exercises_folder_is_up_to_date():
    assert exercises.sources(), "no solutions/exNN_*.py found"
    assert exercises.stale() == [], "run `minipar exercises --generate` and commit exercises/"


def test_every_solution_has_blocks_and_the_exercise_raises():
    for path in exercises.sources():
        text, blocks = exercises.generated(path)
        assert blocks >= 1, f"{path.name} has no BEGIN/END SOLUTION block"
        assert text.count("raise NotImplementedError(") == blocks


def test_generate_keeps_a_students_work(tmp_path):
    written = exercises.generate(tmp_path)
    assert "ex03_ring_allreduce.py" in written and exercises.stale(tmp_path) == []
    solved = tmp_path / "ex03_ring_allreduce.py"
    solved.write_text((exercises.tree("solutions") / "ex03_ring_allreduce.py").read_text())
    with pytest.raises(ValueError, match="filled in"):
        exercises.generate(tmp_path)
    exercises.generate(tmp_path, force=True)
    assert exercises.stale(tmp_path) == []


def test_classify_reads_the_harness_message():
    not_started = AssertionError(
        "exercises.py [x] on 2 ranks (mpi) failed:\n--- rank 0 ---\nTraceback (most recent call "
        'last):\n  File "a.py", line 3, in f\n    raise NotImplementedError("hint")\n'
        "NotImplementedError: send chunk r\n--- rank 1 ---\nNotImplementedError: send chunk r"
    )
    assert grade.classify(not_started) == ("not started", "send chunk r")
    failed = AssertionError(
        'x failed:\n--- rank 1 ---\nTraceback (most recent call last):\n  File "a.py"\n'
        "AssertionError: rank 1 has [1 2]\n--- rank 2 ---\nAssertionError: other"
    )
    assert grade.classify(failed) == ("failed", "AssertionError: rank 1 has [1 2]")
    assert grade.classify(NotImplementedError("hint")) == ("not started", "hint")
    assert grade.classify(AssertionError("p=2: 3, want 4\nassert 3 == 4")) == (
        "failed",
        "p=2: 3, want 4",
    )
    assert grade.classify(None) == ("passed", "")


def _grade(tmp_path, *args):
    out = tmp_path / "results.json"
    done = subprocess.run(
        warm_python(["-m", "minipar", "grade", *args, "--json", str(out)]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, (json.loads(out.read_text()) if out.exists() else [])


@pytest.mark.own_job
def test_grade_fresh_exercises_all_not_started(tmp_path):
    """The untouched exercises fail, and only with NotImplementedError: every test of every
    exercise is reported as not started, with its hint."""
    done, results = _grade(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert results, done.stdout + done.stderr
    others = [r for r in results if r["status"] != "not started"]
    assert not others, others[:5]
    graded = {r["exercise"] for r in results}
    assert graded == {p.stem for p in exercises.sources()}
    assert all(r["detail"] for r in results), "each not-started test shows its hint"
    assert "not started" in done.stdout


@pytest.mark.own_job
def test_grade_solutions_passes(tmp_path):
    """`minipar grade --solutions` through the same machinery (one exercise by name, lesson 04's
    one-process fit: fast; the multi-rank solutions are graded by test_exercises.py in every
    run)."""
    done, results = _grade(tmp_path, "ex04_alpha_beta_fit", "--solutions")
    assert done.returncode == 0, done.stdout + done.stderr
    assert results and all(r["status"] == "passed" for r in results), results
    assert {r["exercise"] for r in results} == {"ex04_alpha_beta_fit"}


def test_register_adds_only_what_the_student_wrote(tmp_path):
    """register() returns names `algorithm=` takes, and only for functions the student wrote: a
    fresh exercise (still raising NotImplementedError) is left out."""
    import minipar
    from minipar.collectives import registry

    saved = {c: dict(t) for c, t in registry.ALGORITHMS.items()}
    try:
        exercises.generate(tmp_path)
        assert minipar.exercises.register(str(tmp_path)) == []
        solved = (exercises.tree("solutions") / "ex03_ring_allreduce.py").read_text()
        (tmp_path / "ex03_ring_allreduce.py").write_text(solved)
        assert minipar.exercises.register(str(tmp_path)) == ["student_ring"]
        assert "student_ring" in minipar.algorithms("all_reduce")
        assert "student_recursive_doubling" not in minipar.algorithms("all_reduce")
        every = minipar.exercises.register("solutions")
        assert set(every) == {name for *_, name in minipar.exercises.PLUGS}
    finally:
        for collective, table in registry.ALGORITHMS.items():
            table.clear()
            table.update(saved.get(collective, {}))


def test_grade_refuses_bad_nodes_before_any_rank(capsys):
    from minipar import cli

    args = cli.build_parser("grade").parse_args(["grade", "04", "--nodes", "0"])
    assert grade.main(args) == 2
    assert "--nodes 0" in capsys.readouterr().err
