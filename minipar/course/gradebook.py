"""The grade as course platforms read it: points per exercise, Gradescope's results.json, JUnit XML.

    minipar grade --format gradescope --json /autograder/results/results.json
    minipar grade --format junit --json report.xml        (GitHub Classroom, CI test reports)

Points come from solutions/points.toml (the instructor's table):

    default = 10              # an exercise not listed below
    [points]
    ex03_ring_allreduce = 30

An exercise's points are split evenly over its tests, so passing 3 of its 4 tests earns 3/4 of
them. Gradescope gets one test per case (name, score, max_score, status "passed" or "failed",
output: the first error and the grader's explanation) and the total score; JUnit gets one
<testsuite> per exercise and one <testcase> per test, a <failure> for each failed or not started.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

DEFAULT_POINTS = 10.0


@dataclass
class Result:
    exercise: str  # ex03_ring_allreduce
    test: str  # what was checked, e.g. "values on 4 ranks"
    status: str  # "passed", "failed" or "not started"
    detail: str = ""  # the first line of the error, or the NotImplementedError's hint
    explanation: str = ""  # where it parted from the solution (minipar.course.stepdiff), if known
    seconds: float = 0.0
    hidden: bool = False  # from the instructor's hidden tests (--hidden-tests): after the due date


def _toml(text: str) -> dict:
    """tomllib where there is one (Python 3.11+); else the subset a points table uses:
    comments, `[section]` and `name = number` lines."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = None
    if tomllib is not None:
        return tomllib.loads(text)
    data: dict = {}
    here = data
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            here = data.setdefault(line[1:-1].strip(), {})
        elif "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            try:
                here[key.strip('"')] = float(value)
            except ValueError:
                raise ValueError(f"line {n}: {key} = {value} is not a number") from None
        elif line:
            raise ValueError(f"line {n}: cannot read {raw.strip()!r}")
    return data


def points_table(path: Path | None) -> tuple[float, dict[str, float]]:
    """(default points, {exercise: points}) from a points.toml; the defaults if there is none."""
    if path is None or not Path(path).exists():
        return DEFAULT_POINTS, {}
    data = _toml(Path(path).read_text())
    default = data.get("default", DEFAULT_POINTS)
    table = data.get("points", {})
    for name, value in [("default", default), *table.items()]:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{path}: points for {name} must be a number >= 0, got {value!r}")
    return float(default), {k: float(v) for k, v in table.items()}


def counts(r) -> bool:
    """Whether a test earns points: a case on 1 rank does not (an empty body passes it: there
    is nothing to send), unless the exercise has no other."""
    return not r.test.endswith(" on 1 rank")


def scored(results, points) -> list[tuple]:
    """(result, score, max_score) per test: an exercise's points split evenly over its tests
    that count (course/gradebook.counts); the others are shown, worth 0."""
    default, table = points
    per_exercise: dict[str, list] = {}
    for r in results:
        per_exercise.setdefault(r.exercise, []).append(r)
    out = []
    for r in results:
        mine = per_exercise[r.exercise]
        earning = [t for t in mine if counts(t)] or mine
        earns = any(r is e for e in earning)
        worth = table.get(r.exercise, default) / len(earning) if earns else 0.0
        out.append((r, worth if r.status == "passed" else 0.0, worth))
    return out


def output_of(r) -> str:
    """What a student reads for one test: the error, then the grader's explanation."""
    if r.status == "passed":
        return ""
    head = f"{r.status}: {r.detail}" if r.detail else r.status
    return head + (f"\n\n{r.explanation}" if r.explanation else "")


VISIBILITY = ("visible", "hidden", "after_due_date", "after_published")


def visibility_table(path: Path | None) -> dict[str, str]:
    """{exercise or "exercise: test": Gradescope's visibility} from points.toml's
    [visibility] table (a test not named there is visible)."""
    if path is None or not Path(path).exists():
        return {}
    table = _toml(Path(path).read_text()).get("visibility", {})
    for name, value in table.items():
        if value not in VISIBILITY:
            raise ValueError(f"{path}: visibility of {name} must be one of {VISIBILITY}, "
                             f"got {value!r}")  # fmt: skip
    return dict(table)


def gradescope(results, points, visibility: dict | None = None) -> dict:
    """Gradescope's autograder results.json: tests, each with a score, and the total score;
    each test's visibility from `visibility` (by "exercise: test", then by exercise)."""
    rows, shown = scored(results, points), visibility or {}
    tests = [
        {
            "name": f"{r.exercise}: {r.test}",
            "number": f"{i + 1}",
            "score": round(score, 6),
            "max_score": round(worth, 6),
            "status": "passed" if r.status == "passed" else "failed",
            "output": output_of(r),
            "output_format": "text",
            "tags": [r.exercise],
            "visibility": shown.get(
                f"{r.exercise}: {r.test}",
                shown.get(r.exercise, "after_due_date" if r.hidden else "visible"),
            ),
        }
        for i, (r, score, worth) in enumerate(rows)
    ]
    total, most = sum(s for _, s, _ in rows), sum(w for _, _, w in rows)
    passed = sum(r.status == "passed" for r in results)
    return {
        "score": round(total, 6),  # a sum of split points: 294.9999999999998 is 295
        "output": f"{passed} of {len(results)} tests passed: {total:g} of {most:g} points",
        "output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "execution_time": round(sum(r.seconds for r in results), 3),
        "tests": tests,
    }


def junit(results, points) -> str:
    """JUnit XML: <testsuites> of one <testsuite> per exercise (its points and score as
    properties), a <testcase> per test, a <failure> for each one not passed."""
    rows = scored(results, points)
    top = ET.Element("testsuites", name="minipar grade")
    suites: dict[str, ET.Element] = {}
    earned: dict[str, list[float]] = {}
    for r, score, worth in rows:
        if r.exercise not in suites:
            suites[r.exercise] = ET.SubElement(top, "testsuite", name=r.exercise)
            ET.SubElement(suites[r.exercise], "properties")
            earned[r.exercise] = [0.0, 0.0]
        earned[r.exercise][0] += score
        earned[r.exercise][1] += worth
        case = ET.SubElement(
            suites[r.exercise],
            "testcase",
            classname=f"minipar.grade.{r.exercise}",
            name=r.test,
            time=f"{r.seconds:.3f}",
        )
        if r.status != "passed":
            failure = ET.SubElement(case, "failure", message=r.detail, type=r.status)
            failure.text = output_of(r)
    for name, suite in suites.items():
        props = suite.find("properties")
        ET.SubElement(props, "property", name="score", value=f"{earned[name][0]:g}")
        ET.SubElement(props, "property", name="points", value=f"{earned[name][1]:g}")
    for suite in [top, *suites.values()]:
        cases = list(suite.iter("testcase"))
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
        suite.set("errors", "0")
        suite.set("skipped", "0")
        suite.set("time", f"{sum(float(c.get('time')) for c in cases):.3f}")
    ET.indent(top)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(top, encoding="unicode") + "\n"
