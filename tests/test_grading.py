"""The grader explains: typical mistakes planted in copies of the solutions, and the grader's
explanation must name the phase, step, rank and chunk (tests/ranks/grading.py, one launch on 4
ranks); `minipar grade` end to end on one planted exercise, with Gradescope's results.json; the
JUnit XML; the points table; which rank is named as the root cause (not the lowest that
failed: the first whose error was its own), and the stop's rules on one process.

Checks: minipar/course/stepdiff.py, stopping.py, whose.py, gradebook.py, cli/grade.py."""

import json
import os
import subprocess
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from conftest import ranks_suite, warm_python
from planted import DEFAULT, PLANTED

from minipar.cli import grade
from minipar.course import exercises, gradebook, whose
from minipar.testing import harness

SUITE = ranks_suite("grading.py")

# mistake -> (exercise, the line as the solution has it, the planted line)
MISTAKES = {
    "wrong_chunk": (
        "ex03_ring_allreduce",
        "        send_c, recv_c = (r - s) % p, (r - s - 1) % p\n",
        "        send_c, recv_c = (r - s + (s == p - 2)) % p, (r - s - 1) % p\n",
    ),
    "off_by_one_steps": (
        "ex03_ring_allreduce",
        "    for s in call.rounds(p - 1):\n        send_c, recv_c = (r - s - 1) % p",
        "    for s in call.rounds(p - 2):\n        send_c, recv_c = (r - s - 1) % p",
    ),
    "wrong_size": (
        "ex03_ring_allreduce",
        "        call.sendrecv(layout.chunk(x, edges, send_c), right, "
        "layout.chunk(x, edges, recv_c), left)\n",
        "        out = layout.chunk(x, edges, send_c)\n"
        "        call.sendrecv(out[:-1], right, layout.chunk(x, edges, recv_c), left)\n",
    ),
    "send_first_deadlock": (
        "ex02_ring_shift",
        "    call.sendrecv(x, (r + shift) % p, out, (r - shift) % p)\n",
        "    call.send(x, (r + shift) % p)\n    call.recv(out, (r - shift) % p)\n",
    ),
    "wrong_peer": (
        "ex02_broadcast_binomial",
        "call.send(x, (call.rank + mask) % p)",
        "call.send(x, (call.rank + mask + 1) % p)",
    ),
    "wrong_chunk_across": (
        "ex04_hierarchical_allreduce",
        "    ring.all_reduce_ring(across, layout.chunk(x, edges, inside.rank), op)\n",
        "    ring.all_reduce_ring(across, layout.chunk(x, edges, 0), op)\n",
    ),
    "missing_reduction": (
        "ex03_recursive_doubling",
        "        reduce_(x, incoming, op)\n",
        "",
    ),
}


def plant_line(folder, exercise: str, line: str, planted: str, what: str) -> None:
    """folder/EXERCISE.py: the worked answer with its one `line` replaced by `planted`."""
    text = (exercises.tree("solutions") / f"{exercise}.py").read_text()
    assert text.count(line) == 1, f"{what}: the solution no longer has {line!r}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{exercise}.py").write_text(text.replace(line, planted))


def plant(folder, mistake: str) -> None:
    exercise, line, planted = MISTAKES[mistake]
    plant_line(folder, exercise, line, planted, mistake)


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    for mistake in MISTAKES:
        plant(root / mistake, mistake)
    saved = {k: os.environ.get(k) for k in ("MINIPAR_PLANTED", "MINIPAR_TIMEOUT")}
    os.environ.update(MINIPAR_PLANTED=str(root), MINIPAR_TIMEOUT="2")  # deadlocks: 2 s each
    try:
        yield harness.run_suite(SUITE, 4, "mpi")
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_grader_names_the_planted_mistake(planted_run, mistake):
    planted_run.check(mistake)


def test_the_root_cause_is_the_rank_whose_error_was_its_own(planted_run):
    """Rank 0 fails too (its wait for rank 2 stopped), but rank 2 is named first."""
    planted_run.check("root_cause_not_the_lowest_rank")


VISIBILITY = ("hidden", "after_due_date", "after_published", "visible")


def check_gradescope(results: dict) -> None:
    """Gradescope's documented results.json: a total score, and tests each with a name, score,
    max_score, status passed/failed and output (text)."""
    assert isinstance(results["score"], (int, float))
    assert isinstance(results["tests"], list) and results["tests"]
    for t in results["tests"]:
        assert isinstance(t["name"], str) and t["name"]
        assert isinstance(t["score"], (int, float)) and isinstance(t["max_score"], (int, float))
        assert 0 <= t["score"] <= t["max_score"]
        assert t["status"] in ("passed", "failed")
        assert isinstance(t["output"], str)
        assert t.get("visibility", "visible") in (
            "hidden",
            "after_due_date",
            "after_published",
            "visible",
        )
    assert results.get("stdout_visibility", "hidden") in VISIBILITY


def sample_results():
    explanation = "all-gather step 0: rank 0 sent chunk 1 (x[4:8], 32 B) to rank 1; ..."
    return [
        grade.Result("ex03_ring_allreduce", "values on 2 ranks", "passed", seconds=1.5),
        grade.Result(
            "ex03_ring_allreduce", "whose_data on 2 ranks", "failed", "Assert <&>", explanation
        ),
        grade.Result("ex02_ring_shift", "shift_1 on 2 ranks", "not started", ""),
    ]


def test_gradescope_and_junit_from_results(tmp_path):
    points = (10.0, {"ex03_ring_allreduce": 30.0})
    results = gradebook.gradescope(sample_results(), points)
    check_gradescope(results)
    assert [t["max_score"] for t in results["tests"]] == [15, 15, 10]
    assert results["score"] == 15
    assert "all-gather step 0" in results["tests"][1]["output"]
    root = ET.fromstring(gradebook.junit(sample_results(), points))
    assert root.tag == "testsuites" and root.get("tests") == "3" and root.get("failures") == "2"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"ex03_ring_allreduce", "ex02_ring_shift"}
    ring = suites["ex03_ring_allreduce"]
    assert (ring.get("tests"), ring.get("failures"), ring.get("errors")) == ("2", "1", "0")
    assert ring[0].tag == "properties"  # JUnit's schema: properties first, then the cases
    props = {p.get("name"): p.get("value") for p in ring.find("properties")}
    assert props == {"score": "15", "points": "30"}
    cases = ring.findall("testcase")
    assert [c.get("name") for c in cases] == ["values on 2 ranks", "whose_data on 2 ranks"]
    assert all(c.get("classname") and float(c.get("time")) >= 0 for c in cases)
    assert cases[0].find("failure") is None
    failure = cases[1].find("failure")
    assert failure.get("message") == "Assert <&>" and failure.get("type") == "failed"
    assert "all-gather step 0" in failure.text
    assert suites["ex02_ring_shift"].find("testcase/failure").get("type") == "not started"


def test_points_table(tmp_path):
    table = tmp_path / "points.toml"
    table.write_text("# a comment\ndefault = 4\n[points]\nex02_ring_shift = 6 # six\n")
    assert gradebook.points_table(table) == (4.0, {"ex02_ring_shift": 6.0})
    assert gradebook._toml(table.read_text().replace("tomllib", "")) == {
        "default": 4,
        "points": {"ex02_ring_shift": 6},
    }
    table.write_text("[points]\nex02_ring_shift = -1\n")
    with pytest.raises(ValueError, match="ex02_ring_shift must be a number >= 0"):
        gradebook.points_table(table)
    assert gradebook.points_table(tmp_path / "none.toml") == (gradebook.DEFAULT_POINTS, {})
    shipped = gradebook.points_table(exercises.tree("solutions") / "points.toml")[1]
    assert set(shipped) <= {p.stem for p in exercises.sources()}


def test_whose_words():
    p = 4
    total = sum(whose.sum_input(r, p, 8) for r in range(p))
    assert whose.sum_words(total[5], p, 5) == "the sum of ranks {0, 1, 2, 3}"
    assert whose.sum_words(total[5], p, 4) == "element 5's sum of ranks {0, 1, 2, 3}"
    two = whose.sum_input(1, p, 8) * 2
    assert whose.sum_words(two[3], p, 3) == "rank 1 twice (elements adding up to 6)"
    assert whose.sum_words(0.5, p) == "0.5"
    assert whose.copy_words(whose.copy_input(2, 9)[7]) == "rank 2's element 7"
    assert whose.copy_words(-1.0) == "-1 (never written)"
    got = whose.sum_input(1, 2, 6)
    want = whose.sum_input(0, 2, 6) + whose.sum_input(1, 2, 6)
    assert whose.first_wrong(got, want, lambda v, i: whose.sum_words(v, 2, i), 0) == (
        "rank 0, element 0: holds the sum of ranks {1} but should hold the sum of ranks {0, 1} "
        "(6 elements wrong)"
    )
    assert whose.first_wrong(want, want, str, 0) is None


def _decoded(p: int, n: int, parts) -> tuple[str, list]:
    """The words and fields of a sum of (rank, element) parts, added as the grader adds them."""
    inputs = [whose.sum_input(r, p, n) for r in range(p)]
    value = sum((inputs[r][i] for r, i in parts), np.float64(0))
    return whose.sum_words(value, p, 0), whose._fields(value, p)


def test_whose_sums_decode_uniquely():
    """A sum of sum_input()s decodes to each rank's count and the indices it came from, never
    to another sum: rank 0's element 0 plus rank 1's element 4 is not element 2's sum (issue 71).
    Proved by the fields (each rank's count and index sum in a base-W digit of its own, W^p <=
    2^53, every field below W), and by every sum on 2 ranks of 8 elements with a rank added up
    to 3 times, and every one-element-a-rank sum on 4 ranks of 16 (the grader's p <= 4, n = 4p)."""
    import itertools

    assert _decoded(2, 8, [(0, 0), (1, 4)])[0] == "rank 0's element 0 + rank 1's element 4"
    assert _decoded(2, 8, [(0, 4), (1, 4)])[0] == "element 4's sum of ranks {0, 1}"
    for p in range(1, 9):
        w, k = whose._layout(p)
        n = 4 * p
        assert w**p <= 2**53 and whose._capacity(p) >= n
        fields = {c + (k + 1) * s for c in range(k + 1) for s in range(c * (n - 1) + 1)}
        assert max(fields) < w and len(fields) == sum(c * (n - 1) + 1 for c in range(k + 1))
    for n in (1, 8):  # n = 1: the smallest; 8 = 4p
        per_rank = [
            m for size in range(4) for m in itertools.combinations_with_replacement(range(n), size)
        ]
        seen = {}
        for a, b in itertools.product(per_rank, repeat=2):
            words, fields = _decoded(2, n, [(0, i) for i in a] + [(1, i) for i in b])
            assert fields == [(len(a), sum(a)), (len(b), sum(b))], (a, b)
            assert seen.setdefault(tuple(fields), words) == words
    for parts in itertools.product([None, *range(16)], repeat=4):  # one element a rank or none
        picked = [(r, i) for r, i in enumerate(parts) if i is not None]
        words = _decoded(4, 16, picked)[0]
        ranks = "{" + ", ".join(str(r) for r, _ in picked) + "}"
        if not picked:
            want = "nothing (0)"
        elif len({i for _, i in picked}) == 1:
            i = picked[0][1]
            want = f"{'the' if i == 0 else f'element {i}' + chr(39) + 's'} sum of ranks {ranks}"
        else:
            want = " + ".join(f"rank {r}'s element {i}" for r, i in picked)
        assert words == want, (parts, words)
    with pytest.raises(ValueError, match="33 elements on 8 ranks"):
        whose.sum_input(0, 8, 33)


def test_classify_keeps_the_explanation_apart():
    error = AssertionError(
        'x failed:\n--- rank 1 ---\nTraceback (most recent call last):\n  File "a.py"\n'
        "minipar.course.stepdiff.ExplainedError: AssertionError: rank 1, element 4: holds X\n"
        f"{grade.SENTINEL}\nall-gather step 0: rank 0 sent chunk 1 (x[4:8]) to rank 1\n"
        "  rank  yours\nMessageSizeError: looks like an error line\n--- rank 2 ---\nother"
    )
    assert grade.classify(error) == ("failed", "AssertionError: rank 1, element 4: holds X")
    assert grade.explanation(error).splitlines()[0] == (
        "all-gather step 0: rank 0 sent chunk 1 (x[4:8]) to rank 1"
    )
    assert grade.explanation(error).endswith("MessageSizeError: looks like an error line")


def test_lesson_03_shows_the_tables_the_grader_prints():
    """Lesson 03's graded example is what stepdiff renders for the lesson's planted bug (the last
    all-gather step sends chunk r-s+1) on 2 ranks, 4 elements per chunk."""
    from minipar.course.stepdiff import Message, Notes, Side, Where, explanation

    def chunk(c):
        return Where("x", 4 * c, 4 * c + 4, c)

    def notes(r, sent):
        def side(send_chunk):
            return Side(
                [
                    Message(1, "send", 1 - r, 32, chunk(send_chunk)),
                    Message(1, "recv", 1 - r, 32, chunk(1 - r)),
                ],
                [(0, 1), (1, 1)],
                [],
                "",
            )

        return Notes(r, side(r), side(sent), ("reduce-scatter", "all-gather"), None)

    text = explanation([[notes(0, 1)], [notes(1, 0)]])
    lesson = (exercises.repo_root() / "lessons" / "03_ring_and_tree.md").read_text()
    for line in text.splitlines():
        assert line.strip() in lesson, f"lessons/03 lacks the grader's line {line.strip()!r}"


def test_locate_names_the_part_of_the_buffer():
    import numpy as np

    from minipar.course.stepdiff import Where, locate

    x, out = np.zeros(10), np.zeros(10)
    bases = {"x": x, "out": out}
    assert locate(x[3:6], bases, 4) == Where("x", 3, 6, 1)  # bounds(10, 4) = 0 3 6 8 10
    assert locate(out[8:10], bases, 4) == Where("out", 8, 10, 3)
    assert locate(x[1:4], bases, 4) == Where("x", 1, 4, None)
    assert locate(out, bases, 4) == Where("out", 0, 10, whole=True)
    assert locate(np.zeros(3), bases, 4) == Where("", 0, 3)
    assert locate(x[3:6], bases, 4).describe(24) == "chunk 1 (x[3:6], 24 B)"
    assert locate(x.view(np.int32)[:2], bases, 4).name == ""  # another element type: not x


# ex07's slips, planted in copies of the solution: (the planted warm-up line, the first line the
# order test and the peak test must both start with, what the second line must say)
SLIPS_1F1B = {
    "GPipe's order": (
        "    warmup = m\n",
        "this is GPipe's order: all forwards first, then all backwards; 1F1B runs "
        "min(p - r - 1, m) warm-up forwards",
        "rank 1 holds all 2 micro-batches' activations, 1F1B's 1; the bubble is the same",
    ),
    "one warm-up forward too many": (
        "    warmup = min(p - rank, m)\n",
        "rank 1 does 1 warm-up forwards, 1F1B does min(p - r - 1, m) = 0 (p=2 m=2): one too many",
        "rank 1 holds 2 micro-batches' activations instead of 1, for a bubble no smaller",
    ),
    "one warm-up forward too few": (
        "    warmup = max(min(p - rank - 2, m), 0)\n",
        "rank 0 does 0 warm-up forwards, 1F1B does min(p - r - 1, m) = 1 (p=2 m=2): one too few",
        # p=2 m=2, F = 1, B = 2: each rank computes 6 of a 12-long step (F0 B0 F1 B1 in turn)
        "the bubble becomes 0.5000 of the time instead of (p-1)/(m+p-1) = 0.3333",
    ),
}


@pytest.mark.parametrize("slip", list(SLIPS_1F1B))
def test_1f1b_feedback_names_the_slip(tmp_path, slip):
    """ex07's two tests on a planted slip: the first line names it (GPipe's order and one
    warm-up forward too many differ, though at p=2 m=2 their lists are the same), the second
    says what it costs: memory for too many, the bubble for too few."""
    import test_exercises as T

    planted, first, second = SLIPS_1F1B[slip]
    line = "    warmup = min(p - rank - 1, m)\n"
    plant_line(tmp_path, "ex07_one_f_one_b", line, planted, slip)
    for test in (T.test_ex07_one_f_one_b_order, T.test_ex07_one_f_one_b_verifies):
        with pytest.raises(AssertionError) as failed:
            test(str(tmp_path))
        lines = str(failed.value).splitlines()
        assert lines[0].startswith(first), f"{test.__name__}, {slip}: {lines[0]!r}"
        assert second in lines[1], f"{test.__name__}, {slip}: {lines[1]!r}"


# ex12's best_interval slipped: (the planted return line, lines the feedback must hold)
SLIPS_12 = {
    "linear in the save cost": (
        "    return 2 * save_s * mtbi_s / 100\n",  # 2226 s at save 10 s, M 11130 s
        # the waste save/t + (600 + t/2)/M: 15.840% at 2226 s, 9.630% at sqrt(2 x 10 x 11130)
        "yours 2226 s wastes 15.840% of the clock, 6.21 points above the least waste (9.630%, "
        "at a shorter interval)",
        "4x the save cost: yours grows 4x (linear in it), the least-waste interval 2x",
    ),
    "without the 2": (
        "    return math.sqrt(save_s * mtbi_s)\n",
        "yours 333.617 s wastes 9.887% of the clock, 0.257 points above the least waste",
        "the growth is right, the constant is not: yours is 0.707x the best",
    ),
}


@pytest.mark.parametrize("slip", list(SLIPS_12))
def test_checkpoint_interval_feedback_says_how_not_the_formula(tmp_path, slip):
    """ex12's feedback on a planted best_interval: the waste at the student's interval against
    the least, and how it grows with the save cost; never the formula itself."""
    import test_exercises as T

    planted, first, said = SLIPS_12[slip]
    line = "    return math.sqrt(2 * save_s * mtbi_s)\n"
    plant_line(tmp_path, "ex12_checkpoint_interval", line, planted, slip)
    with pytest.raises(AssertionError) as failed:
        T.test_ex12_checkpoint_interval_is_the_minimum(str(tmp_path), 10.0, 11130.0)
    message = str(failed.value)
    assert first in message.splitlines()[0], message
    assert said in message, message
    assert "sqrt" not in message, message
    assert "sqrt" not in (exercises.tree("exercises") / "ex12_checkpoint_interval.py").read_text()


# -- every exercise says where: planted mistakes graded end to end (tests/planted.py) ------------

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
FEEDBACK_LINES = 5


def plant_rows(folder, rows) -> None:
    """One file per exercise in `folder`: its solution with the row's mistake planted."""
    for exercise, mistake, line, planted, _ in rows:
        plant_line(folder, exercise, line, planted, f"{exercise}, {mistake}")


def feedback(stdout: str, exercise: str) -> list[str]:
    """The first FEEDBACK_LINES lines of the report's section on `exercise` ("NAME: 1 failed",
    then its first failures and where they part from the solution)."""
    lines = stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"{exercise}: ")), None)
    assert start is not None, f"no section for {exercise} in:\n{stdout}"
    return lines[start : start + FEEDBACK_LINES]


def grade_planted(tmp_path, rows, *args):
    """`minipar grade [ARGS] --impl DIR` on a folder of planted rows: (result, seconds)."""
    folder = tmp_path / "planted"
    plant_rows(folder, rows)
    start = time.monotonic()
    done = subprocess.run(
        warm_python(["-m", "minipar", "grade", *args, "--impl", str(folder)]),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done, time.monotonic() - start


def check_where(done, rows) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    for exercise, mistake, _, _, where in rows:
        first = feedback(done.stdout, exercise)
        assert any(where in line for line in first), (
            f"{exercise}, {mistake}: the first {FEEDBACK_LINES} lines do not say {where!r}:\n"
            + "\n".join(first)
        )


@pytest.mark.own_job
def test_grade_says_where_for_planted_mistakes(tmp_path):
    """Ten exercises, one realistic mistake each, graded in one `minipar grade --format
    gradescope` (the rest of tests/planted.py with MINIPAR_EXTENDED=1): each exercise's first
    five lines of feedback say where, in its own words; progress went to stderr; Gradescope's
    results.json carries the same explanations and the points."""
    rows = [row for row in PLANTED if row[:2] in DEFAULT]
    assert len(rows) == len(DEFAULT)
    out = tmp_path / "results.json"
    done, _ = grade_planted(tmp_path, rows, "--format", "gradescope", "--json", str(out))
    check_where(done, rows)
    assert "MessageSizeError: rank 1" in done.stdout, done.stdout  # the root cause, first
    assert "graded " in done.stderr and "/" in done.stderr.splitlines()[1], done.stderr[:500]
    results = json.loads(out.read_text())
    check_gradescope(results)
    by_name = {t["name"]: t for t in results["tests"]}
    whose_data = by_name["ex03_recursive_doubling: whose_data on 2 ranks"]
    assert whose_data["status"] == "failed" and whose_data["score"] == 0
    assert "rank 0, element 0: holds the sum of ranks {0} but should hold" in whose_data["output"]
    assert (
        "after step 0: every message matched the reference's, but rank 0's x[0] holds "
        "the sum of ranks {0} where the reference's holds the sum of ranks {0, 1}"
    ) in whose_data["output"]
    points = gradebook.points_table(exercises.tree("solutions") / "points.toml")
    rd = [t for t in results["tests"] if t["tags"] == ["ex03_recursive_doubling"]]
    assert sum(t["max_score"] for t in rd) == pytest.approx(points[1]["ex03_recursive_doubling"])
    assert results["score"] == pytest.approx(sum(t["score"] for t in results["tests"]))


@pytest.mark.own_job
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1: every planted mistake")
@pytest.mark.parametrize("row", PLANTED, ids=lambda row: f"{row[0]}-{row[1]}")
def test_grade_says_where_for_every_planted_mistake(tmp_path, row):
    """One exercise with one planted mistake, graded alone as a student would: its feedback's
    first five lines say where. The seconds to the verdict are a benchmark (printed, see
    `python tests/test_grading.py`), not asserted here."""
    done, seconds = grade_planted(tmp_path, [row], row[0])
    check_where(done, [row])
    print(f"{row[0]}, {row[1]}: {seconds:.1f} s")


def planted_table() -> None:
    """Print the benchmark: for every planted mistake, graded alone (a fresh `python -m minipar
    grade`, as a student runs it), the first line of the feedback, the seconds to the verdict,
    the CPU seconds it took (every process of the grade, ranks included: independent of what
    else the machine runs) and the load average."""
    import resource
    import sys
    import tempfile
    from pathlib import Path

    print("| exercise | mistake | first line of feedback | seconds | CPU seconds | load |")
    print("|---|---|---|---|---|---|")
    for row in PLANTED:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "planted"
            plant_rows(folder, [row])
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "minipar", "grade", row[0], "--impl", str(folder)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            seconds = time.monotonic() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        first = feedback(done.stdout, row[0])
        line = first[1].strip() if len(first) > 1 else "?"
        said = "" if any(row[4] in x for x in first) else " (NOT WHERE EXPECTED)"
        load = os.getloadavg()[0]
        print(
            f"| {row[0]} | {row[1]} | {line}{said} | {seconds:.1f} | {cpu:.1f} | {load:.1f} |",
            flush=True,
        )


if __name__ == "__main__":  # python tests/test_grading.py: the benchmark table
    planted_table()


# -- the stop's and the root cause's rules on one process (issue 72's planted bugs) -------------


def test_a_stop_or_a_timeout_is_a_consequence_and_anything_else_a_cause():
    from minipar.course import stepdiff, stopping
    from minipar.errors import CommTimeoutError, MismatchError

    stop = MismatchError(stopping.STOPPED.format(rank=2, what="AssertionError: wrong"))
    timeout = CommTimeoutError("timed out after 2 s waiting for rank 3")
    mismatch = MismatchError("rank 1 called broadcast where rank 0 called all_reduce")
    for error, follows in ((stop, True), (timeout, True), (mismatch, False),
                           (AssertionError("wrong"), False), (None, False)):  # fmt: skip
        assert stopping.consequence(error) is follows, error
        if error is not None:
            assert stopping.followed(stopping.first_line(error)) is follows, error
    assert stopping.first_line(ValueError("bad size\nmore")) == "ValueError: bad size"
    assert stopping.first_line(AssertionError()) == "AssertionError"
    off = stepdiff.OffCourse("step 0: rank 1 waits for a message\nthe table")
    assert stopping.first_line(off) == "step 0: rank 1 waits for a message"  # its words alone


def _notes(rank, error, pending=()):
    from minipar.course.stepdiff import Notes, Side

    return Notes(rank, Side([], [], [], ""), Side([], [], list(pending), error), (), None)


def test_a_deadlock_is_named_only_when_no_rank_failed_first():
    from minipar.course.stepdiff import Message, Where, _consequences, _pending_lines

    sent = Message(0, "send", 1, 8 << 20, Where("x", 0, 1 << 20, whole=True))
    timeouts = [_notes(r, "CommTimeoutError: timed out", [sent]) for r in (0, 1)]
    lines = _pending_lines(timeouts)
    assert "deadlock" in lines[-1] and not any("stopped with" in line for line in lines)
    mine = [timeouts[0], _notes(1, "AssertionError: wrong", [sent])]
    lines = _pending_lines(mine)
    assert lines[-1] == "rank 1 stopped with AssertionError: wrong"
    assert not any("deadlock" in line for line in lines)
    # (failed, not started, told, a consequence, its first line) per rank
    stopped = "MismatchError: stopped waiting: rank 2 had already failed (AssertionError: own)"
    flags = [(True, False, False, True, stopped), (False, False, False, False, ""),
             (True, False, True, False, "AssertionError: own")]  # fmt: skip
    assert _consequences(flags, 2).splitlines() == [
        "rank 2 failed first; what followed on the other ranks (consequences, not causes):",
        f"  rank 0: {stopped}",
    ]
    # ranks 1 and 2 each failed of their own: rank 2's is no consequence of rank 1's
    both = [flags[0], (True, False, True, False, "AssertionError: a"), flags[2]]
    assert _consequences(both, 1).splitlines()[1:] == [f"  rank 0: {stopped}"]
    only = [(True, False, False, True, "CommTimeoutError: t")] * 2
    assert _consequences(only, None).startswith("no rank failed first;")
