"""The grader's small rules, one process each: a hang's words, a class's uploads and fallback,
similarity's fingerprints, the gradebook's weights and visibility, the policy's corners.
Checks: minipar/cli/grade.py (hang_words, kind), minipar/course/batch.py, similarity.py,
gradebook.py, policy.py, submission.py, codec.py, sandbox.py (a student's prints)."""

import json
import os
import shutil
import textwrap
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from minipar.cli import grade
from minipar.course import (
    batch,
    codec,
    exercises,
    gradebook,
    policy,
    sandbox,
    similarity,
    submission,
)

SOLUTIONS = exercises.tree("solutions")


def stacks(*ranks) -> str:
    """A hung case's message, as the pool writes it: each rank's faulthandler stacks."""
    text = "no result from ranks [0, 1]: ranks [0, 1] were still inside the case 30 s after it"
    for rank, frames in ranks:
        lines = "\n".join(f'  File "{path}", line {line} in {fn}' for path, line, fn in frames)
        text += f"\n--- rank {rank} output ---\nThread 0x1 (most recent call first):\n{lines}\n"
    return text


def test_hang_words_name_the_spinning_rank_first_and_a_deadlock_as_one():
    mine = "/tmp/minipar-grade-x/ex02_broadcast_linear.py"
    wait = "/site/minipar/comm/transport/mpi.py"
    spinning = stacks((0, [(wait, 80, "wait"), (mine, 30, "broadcast_linear")]),
                      (1, [(mine, 26, "broadcast_linear")]))  # fmt: skip
    assert grade.hang_words(spinning, "30") == (
        "rank 1 did not return within 30 s (hung): at ex02_broadcast_linear.py:26 in "
        "broadcast_linear; ranks [0] waited on it"
    )
    both_wait = stacks((0, [(wait, 80, "wait"), (mine, 30, "broadcast_linear")]),
                       (1, [(wait, 81, "wait"), (mine, 31, "broadcast_linear")]))  # fmt: skip
    assert grade.hang_words(both_wait, "30") == (
        "ranks [0, 1] waited on each other for 30 s (deadlock): rank 0 at "
        "ex02_broadcast_linear.py:30 in broadcast_linear; rank 1 at ex02_broadcast_linear.py:31 "
        "in broadcast_linear"
    )
    status, detail = grade.classify(AssertionError(spinning))
    assert status == "failed" and detail.startswith("rank 1 did not return within 30 s")


def test_a_test_not_run_after_a_failure_is_counted_apart_and_earns_nothing():
    Result = gradebook.Result
    results = [Result("ex03_x", "values on 2 ranks", "failed", "AssertionError: off"),
               Result("ex03_x", "ops on 2 ranks", "failed", "not run: ex03_x failed already"),
               Result("ex03_x", "values on 1 rank", "passed")]  # fmt: skip
    assert [grade.kind(r) for r in results] == ["failed", "not run", "passed"]
    rows = gradebook.scored(results, (10.0, {"ex03_x": 20.0}))
    assert [(s, w) for _, s, w in rows] == [(0.0, 10.0), (0.0, 10.0), (0.0, 0.0)]
    alone = gradebook.scored([Result("ex12_y", "a on 1 rank", "passed")], (10.0, {}))
    assert alone[0][1:] == (10.0, 10.0)  # an exercise with only 1-rank cases keeps them


def test_visibility_by_test_then_by_exercise_then_hidden_tests_after_the_due_date(tmp_path):
    table = tmp_path / "points.toml"
    table.write_text('[visibility]\nex03_x = "hidden"\n"ex03_x: ledger" = "visible"\n')
    shown = gradebook.visibility_table(table)
    Result = gradebook.Result
    results = [Result("ex03_x", "ledger", "passed"), Result("ex03_x", "values", "passed"),
               Result("ex12_y", "secret", "passed", hidden=True),
               Result("ex12_y", "public", "passed")]  # fmt: skip
    tests = gradebook.gradescope(results, (10.0, {}), shown)["tests"]
    assert [t["visibility"] for t in tests] == ["visible", "hidden", "after_due_date", "visible"]
    table.write_text('[visibility]\nex03_x = "soon"\n')
    with pytest.raises(ValueError, match="'soon'"):
        gradebook.visibility_table(table)


def test_a_zip_that_would_leave_its_folder_is_refused(tmp_path):
    ups = tmp_path / "ups"
    ups.mkdir()
    with zipfile.ZipFile(ups / "eve.zip", "w") as archive:
        archive.writestr("../../escape/ex03_ring_allreduce.py", "x = 1\n")
    with pytest.raises(ValueError, match=r"eve.zip: \.\./\.\./escape"):
        batch.submissions(ups, tmp_path / "unpacked")
    assert not (tmp_path / "escape").exists()


def test_a_grade_past_its_time_leaves_zeros_saying_so(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "ex12_checkpoint_interval.py").write_text((SOLUTIONS / "ex12_checkpoint_interval.py")
                                                     .read_text())  # fmt: skip
    points = tmp_path / "points.toml"
    points.write_text("[points]\nex12_checkpoint_interval = 10\nex11_nccl_rings = 5\n")
    graded = batch.grade_one("ann", sub, tmp_path / "out", points, timeout=0.5)
    saved = json.loads((tmp_path / "out" / "ann" / "results.json").read_text())
    assert graded["minipar_status"].startswith("the grade of this submission did not finish")
    assert saved["score"] == 0 and {t["tags"][0] for t in saved["tests"]} == {
        "ex12_checkpoint_interval", "ex11_nccl_rings"}  # fmt: skip
    assert sum(t["max_score"] for t in saved["tests"]) == 15


def test_similarity_ignores_names_numbers_and_the_stub_and_needs_a_run_of_k_tokens():
    code = textwrap.dedent("""\
        def f(a, b):
            total = 0
            for i in range(len(a)):
                total += a[i] * b[i] + 3
            return total
    """)
    renamed = code.replace("total", "acc").replace("a", "xs").replace("3", "7")
    prints = similarity.fingerprints(code)
    assert prints and similarity.fingerprints(renamed) == prints
    assert similarity.fingerprints(code, given=code) == set()  # all of it the stub's
    short = "x = y + 1\n"  # fewer than K tokens: no fingerprint, never a match
    assert len(similarity.tokens(short)) < similarity.K and similarity.fingerprints(short) == set()
    other = "def g(q):\n    while q:\n        q = q // 2\n    return q\n"
    assert similarity.overlap(prints, similarity.fingerprints(other)) < 0.5
    pairs = similarity.report({"ann": {"ex": code}, "bob": {"ex": renamed}, "cy": {"ex": other}},
                              {}, {})  # fmt: skip
    assert pairs == [(1.0, "ex", "ann", "bob")]


def refusals(text: str, exercise: str = "ex03_ring_allreduce") -> list[str]:
    allowed = policy.allowed_imports(SOLUTIONS / f"{exercise}.py")
    return policy.check_text(textwrap.dedent(text), f"{exercise}.py", allowed)


def test_policy_refuses_a_private_attribute_and_global_state():
    assert ".\u005fexchange" in " ".join(refusals("def f(call, x):\n    call._exchange(x)\n"))
    assert "global" in " ".join(refusals("def f():\n    global seen\n"))
    assert refusals("def f(call, x):\n    call.sendrecv(x, 1, x, 0)\n") == []


def test_the_shallowest_copy_of_an_exercise_wins(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "ex12_checkpoint_interval.py").write_text("top = 1\n")
    (tmp_path / "a" / "b" / "ex12_checkpoint_interval.py").write_text("deep = 1\n")
    found = submission.files(tmp_path, {"ex12_checkpoint_interval"})
    assert found["ex12_checkpoint_interval"].read_text() == "top = 1\n"


def test_codec_keeps_dtypes_and_refuses_an_unknown_one():
    import torch

    for value in (np.arange(5, dtype=np.int64), np.float16(1.5), torch.arange(4, dtype=torch.int8),
                  torch.tensor([0.5, -1.0], dtype=torch.float16)):  # fmt: skip
        back = codec.decode(json.loads(json.dumps(codec.encode(value))))
        assert type(back) is type(value) or (isinstance(value, np.generic) and back.shape == ())
        assert back.dtype == value.dtype and np.array_equal(np.asarray(back), np.asarray(value))
    with pytest.raises(codec.CodecError, match="no torch dtype 'nothing'"):
        codec.decode({"tensor": {"torch": "nothing", "dtype": "<f4", "shape": [0], "data": ""}})


def test_a_student_who_prints_does_not_garble_the_walls_replies():
    import tempfile

    top = tempfile.mkdtemp(prefix="minipar-wall-test-")  # others may read it (the child: nobody)
    os.chmod(top, 0o755)
    folder = Path(top) / "sub"
    folder.mkdir()
    os.chmod(folder, 0o755)
    (folder / "ex12_checkpoint_interval.py").write_text(
        'print("hello from import")\n'
        "def best_interval(s, m):\n"
        '    print("{\\"id\\": \\"forged\\", \\"value\\": 999}")\n'
        "    return s + m\n"
    )
    os.environ.pop(sandbox.HIDE_ENV, None)
    wall = sandbox.Wall(str(folder), timeout=20)
    try:
        mod = sandbox.SealedModule(wall, "ex12_checkpoint_interval")
        assert mod.best_interval(2.0, 3.0) == 5.0
        deadline = time.monotonic() + 10  # a thread reads the child's stderr: wait for the line
        while time.monotonic() < deadline and not any("forged" in line for line in wall.errors):
            time.sleep(0.02)
        assert any("forged" in line for line in wall.errors)  # what it printed: on stderr
    finally:
        wall.close()
        shutil.rmtree(top)


@pytest.mark.skipif(os.geteuid() != 0, reason="as root: the student's process runs as nobody")
def test_as_root_the_submission_goes_where_nobody_can_enter(tmp_path, monkeypatch):
    """A root-only TMPDIR (0700) would make every one-process test a PermissionError for the
    student's process (nobody): the grader's copy goes to /tmp instead."""
    import tempfile

    from minipar.course import submission

    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    open_one = tmp_path / "open"
    open_one.mkdir()
    for p in (tmp_path, open_one):
        os.chmod(p, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    assert not submission.others_can_enter(str(private))
    assert submission.reachable_tmp() != str(private)
    assert submission.others_can_enter(submission.reachable_tmp())
    ancestors_open = all(os.stat(p).st_mode & 0o001 for p in (open_one, *open_one.parents))
    monkeypatch.setattr(tempfile, "tempdir", str(open_one))
    assert submission.reachable_tmp() == (str(open_one) if ancestors_open else "/tmp")
