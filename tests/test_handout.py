"""The student edition (minipar/course/handout.py, minipar/cli/course.py, the ANSWER markers in the
library, minipar/collectives/standins.py, minipar.exercises.assigned): what a course hands out
holds none of the worked answers, and its library runs the student's exercises."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from minipar.course import exercises, handout

SOLUTIONS = exercises.tree("solutions")
ROOT = exercises.repo_root()


def answer_lines(solution: Path) -> list[str]:
    """The worked answer's own lines (inside BEGIN/END SOLUTION), 12 characters or more, not
    comments: what must not stand in the hand-out."""
    inside, found = False, []
    for line in solution.read_text().splitlines():
        if "# BEGIN SOLUTION" in line:
            inside = True
        elif "# END SOLUTION" in line:
            inside = False
        elif inside and len(line.strip()) >= 12 and not line.strip().startswith("#"):
            found.append(line.strip())
    return found


@pytest.fixture(scope="module")
def every_exercise(tmp_path_factory):
    dest = tmp_path_factory.mktemp("handout") / "course"
    made = handout.build(dest)
    return dest, made


def test_the_handout_holds_no_worked_answer(every_exercise):
    """No file of the hand-out (the package students install included) holds more than a
    quarter of any worked answer's lines (one, for an answer of four lines or fewer: lines
    such as `p, r = call.size, call.rank` stand everywhere)."""
    dest, _ = every_exercise
    files = [p for p in dest.rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".cfg")]
    held = {p: {line.strip() for line in p.read_text(errors="replace").splitlines()} for p in files}
    for solution in exercises.sources():
        lines = answer_lines(solution)
        assert lines, solution.name
        for path, text in held.items():
            found = [line for line in lines if line in text]
            assert len(found) <= max(1, len(lines) / 4), (
                f"{path.relative_to(dest)} holds {len(found)} of {solution.stem}'s "
                f"{len(lines)} answer lines: {found}"
            )


def test_the_handout_holds_what_students_get_and_nothing_of_the_graders(every_exercise):
    dest, made = every_exercise
    assert made["exercises"] == [p.stem for p in exercises.sources()]
    for absent in ("solutions", "tests", ".ci", "scripts", "docs/course.md"):
        assert not (dest / absent).exists(), absent
    for present in ("setup.cfg", "pyproject.toml", "README.md", "lessons", "minipar/cli"):
        assert (dest / present).exists(), present
    stubs = sorted(p.name for p in (dest / "exercises").glob("ex*.py"))
    assert stubs == sorted(p.name for p in exercises.sources())
    assert (dest / "exercises" / "ex03_ring_allreduce.py").read_text() == exercises.generated(
        SOLUTIONS / "ex03_ring_allreduce.py")[0]  # fmt: skip
    for path in (dest / "minipar").rglob("*.py"):
        compile(path.read_text(), str(path), "exec")  # every cut file still parses
    assert 'EDITION = "student"' in (dest / "minipar" / "exercises.py").read_text()
    # every exercise whose answer the library held was cut from where it stood
    assert {"ex03_ring_allreduce", "ex10_moe_dispatch", "ex07_one_f_one_b"} <= set(made["cut"])
    assert "collectives/ring.py" in " ".join(made["cut"]["ex03_ring_allreduce"])


def test_the_lessons_point_at_the_exercise_not_the_cut_file(every_exercise):
    dest, made = every_exercise
    full = (ROOT / "lessons" / "07_pipeline_parallel.md").read_text()
    mine = (dest / "lessons" / "07_pipeline_parallel.md").read_text()
    assert "`schedules.py` says" in full
    said = (
        "`schedules.py` (its answer to ex07_one_f_one_b is yours: `exercises/ex07_one_f_one_b.py`)"
    )
    assert said in mine
    assert "(its answer to ex07" not in (dest / "lessons" / "06_tensor_parallel.md").read_text()


def test_a_handout_of_some_lessons_cuts_only_theirs(tmp_path):
    made = handout.build(tmp_path / "c", "03")
    assert made["exercises"] == ["ex03_recursive_doubling", "ex03_ring_allreduce"]
    tree = (tmp_path / "c" / "minipar" / "collectives" / "tree.py").read_text()
    full = (ROOT / "minipar" / "collectives" / "tree.py").read_text().splitlines(keepends=True)
    assert tree == "".join(line for line in full if "ANSWER" not in line)  # ex02's: kept
    with pytest.raises(ValueError, match="--exercises 13"):
        handout.build(tmp_path / "d", "03,13")
    with pytest.raises(ValueError, match="not empty"):
        handout.build(tmp_path / "c", "03")


def test_cut_forwards_the_enclosing_functions_arguments_and_names_bad_markers():
    text = textwrap.dedent('''\
        import math


        def f(a, b=2, *rest, key=None, **more):
            """doc"""
            # BEGIN ANSWER ex09_x g
            return a + b
            # END ANSWER


        def h(q):
            # BEGIN ANSWER ex01_y do: return [q,
            # more: q]
            return q
            # END ANSWER
    ''')
    out, done = handout.cut(text, {"ex09_x", "ex01_y"})
    assert done == ["ex09_x", "ex01_y"]
    assert 'return assigned("ex09_x").g(a, b, *rest, key=key, **more)' in out
    assert "    return [q, q]\n" in out and "return a + b" not in out
    assert out.splitlines()[1].startswith("from minipar.exercises import ExerciseNotDone, assigned")
    kept, none = handout.cut(text, set())
    assert none == [] and "return a + b" in kept and "BEGIN ANSWER" not in kept
    with pytest.raises(ValueError, match="file:2: BEGIN ANSWER is never closed"):
        handout.cut("def f():\n    # BEGIN ANSWER ex01_a\n    pass\n", {"ex01_a"})
    with pytest.raises(ValueError, match="END ANSWER without a BEGIN"):
        handout.cut("x = 1\n# END ANSWER\n", set())


RING = textwrap.dedent("""\
    import numpy as np

    import minipar

    minipar.init()
    p, r = minipar.get_world_size(), minipar.get_rank()
    x = np.arange(12, dtype=np.float64) * (r + 1)
    try:
        with minipar.trace() as t:
            minipar.all_reduce(x, algorithm="ring")
    except NotImplementedError as error:
        print(f"rank {r}: {type(error).__name__}: {error}")
    else:
        want = np.arange(12) * sum(range(1, p + 1))
        print(f"rank {r}: ring {'right' if np.array_equal(x, want) else 'WRONG'}, "
              f"{t.bytes_sent()} bytes")
""")


def run_in(dest: Path, script: Path, n: int = 2) -> str:
    env = {**os.environ, "PYTHONPATH": str(dest), "OMP_NUM_THREADS": "1", "MINIPAR_TIMEOUT": "10"}
    env.pop("MINIPAR_EXERCISES", None)
    done = subprocess.run(
        [sys.executable, "-m", "minipar", "run", "-n", str(n), str(script)],
        capture_output=True, text=True, timeout=120, env=env, cwd=dest,
    )  # fmt: skip
    return done.stdout + done.stderr


def test_the_handouts_library_runs_the_students_ring(tmp_path):
    """Until ex03 is written, the ring says which exercise to finish; once it is, the
    student's ring is minipar's ring: the sum, and the ring's 2 (p-1)/p n bytes a rank."""
    dest = tmp_path / "course"
    handout.build(dest, "03")
    script = tmp_path / "ring.py"
    script.write_text(RING)
    said = run_in(dest, script)
    assert "rank 0: ExerciseNotDone: minipar runs your exercise ex03_ring_allreduce" in said, said
    (dest / "exercises" / "ex03_ring_allreduce.py").write_text(
        (SOLUTIONS / "ex03_ring_allreduce.py").read_text())  # fmt: skip
    said = run_in(dest, script)
    nbytes = 2 * (2 - 1) / 2 * 12 * 8  # 2 (p-1)/p n, n = 96 bytes on 2 ranks
    for r in (0, 1):
        assert f"rank {r}: ring right, {nbytes:g} bytes" in said, said


def test_grading_inside_a_handout_says_where_grading_happens(tmp_path):
    dest = tmp_path / "course"
    handout.build(dest, "12")
    env = {**os.environ, "PYTHONPATH": str(dest)}
    done = subprocess.run([sys.executable, "-m", "minipar", "grade"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=dest)  # fmt: skip
    assert done.returncode == 2
    assert "student edition: its grader runs on the course's server" in " ".join(
        done.stderr.split()
    )
