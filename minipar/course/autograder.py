"""Gradescope's bundle: `minipar course autograder OUT.zip`.

Gradescope unpacks the zip into /autograder/source, runs setup.sh once to build its image, and
then, for each submission, `/autograder/run_autograder` with the student's files in
/autograder/submission; it reads /autograder/results/results.json. The bundle holds the full
edition the grader needs (the package, the worked answers, the tests, the points table) and
the two scripts:

    setup.sh         pip: a CPU torch, then minipar with the mpich wheel, from the bundle
    run_autograder   minipar grade --impl /autograder/submission --format gradescope
                     --json /autograder/results/results.json

The grade runs behind the wall (course/sandbox.py): the student's code as an unprivileged user
where the kernel allows it, the answers and the results hidden from it. AUTOGRADER_ROOT
replaces /autograder (tests/test_grade_wall.py runs the bundle in a made-up tree).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from minipar.course import exercises

SETUP = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, to build the image: minipar and what it needs.
set -euo pipefail
cd "${AUTOGRADER_ROOT:-/autograder}/source"
python3 -m pip install --upgrade pip
# a CPU torch (never plain PyPI's first: on Linux that is a multi-GB CUDA build)
python3 -m pip install torch --index-url https://download.pytorch.org/whl/cpu || \\
    python3 -m pip install "torch>=2.2"
python3 -m pip install -e ".[mpich]"
python3 -m minipar doctor || true
"""

RUN = """\
#!/usr/bin/env bash
# Gradescope runs this for each submission: the grade, always a results.json.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
cd "$ROOT/source" || exit 1
export PYTHONPATH="$ROOT/source${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
mkdir -p "$ROOT/results"
python3 -m minipar grade --impl "$ROOT/submission" --format gradescope \\
    --json "$ROOT/results/results.json" {points}
status=$?
# minipar grade writes the results whatever happened; 0: all passed, 1: some failed
[ -s "$ROOT/results/results.json" ] || exit 1
[ "$status" -le 1 ]
"""

SOURCES = ("minipar", "solutions", "tests", "setup.cfg", "pyproject.toml", "README.md")


def build(out: Path, points: Path | None = None, root: Path | None = None) -> list[str]:
    """Write Gradescope's autograder zip to `out`; the names it holds."""
    root = root or exercises.repo_root()
    table = f'--points "$ROOT/source/{points.name}"' if points else ""
    names = []
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in (("setup.sh", SETUP), ("run_autograder", RUN.replace("{points}", table))):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16  # executable once unpacked
            archive.writestr(info, text)
            names.append(name)
        if points:
            archive.write(points, points.name)
            names.append(points.name)
        for top in SOURCES:
            path = root / top
            files = [path] if path.is_file() else sorted(path.rglob("*")) if path.exists() else []
            for file in files:
                if file.is_file() and "__pycache__" not in file.parts and file.suffix != ".pyc":
                    archive.write(file, file.relative_to(root))
                    names.append(str(file.relative_to(root)))
    return names
