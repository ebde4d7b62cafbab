"""The student exercises, generated from the worked solutions (`minipar exercises`, whose face is
minipar/cli/exercises.py).

    minipar exercises                 each exercise, its lesson, and how far exercises/ has got
    minipar exercises --generate      rewrite exercises/ from solutions/ (instructors)
    minipar exercises --check         exit 1 if exercises/ is not what --generate would write

One source, no drift: `solutions/exNN_name.py` holds the answers, and the parts a student writes
sit between marker comments,

    # BEGIN SOLUTION hint: send chunk (r - s - 1) % p to the right ...
    # hint: (more hint, optional)
    ...the answer...
    # END SOLUTION

which `--generate` replaces by `raise NotImplementedError("write this part ...")`, at the same
indent. The hints stay in solutions/: a student sees one only on request, `minipar grade --hints`
(hints give much of an answer away); `--generate --hints` writes them into the exercises
instead, for a course that wants them there.
The student's side (where the files are, loading one, `register()` that plugs a student's
algorithms into minipar) is minipar/exercises.py.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

from minipar.exercises import EDITION, load, repo_root, tree  # noqa: F401  (the grader reads them)

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION(?:\s+hint:\s*(?P<hint>.*))?$")
HINT = re.compile(r"^\s*# hint:\s*(?P<hint>.*)$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
HEADER = (
    "# Generated from solutions/{name} by `minipar exercises --generate`: write your code where\n"
    "# it raises NotImplementedError, then check it with `minipar grade {lesson}`.\n"
    "# The grader admits these imports here (others it refuses, naming the line):\n"
    "#   {imports}\n"
    "#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.\n"
)
README = """\
# Exercises

Generated from `solutions/` by `minipar exercises --generate`; do not edit by hand what you do
not mean to solve. Each file says which lesson it belongs to, and its docstring says what you
write and everything the grader checks (and the words its feedback uses: "chunk 1", "bucket 0",
...). Write your code where a function raises `NotImplementedError`, then grade it:

    minipar grade                 # every exercise
    minipar grade 03              # the exercises of lesson 03
    minipar grade ex03_ring_allreduce      # one exercise
    minipar grade 03 --hints      # and a hint for each part not started yet

A failed test says where your work first parts from the worked answer: the step, the rank, the
chunk (or the bucket, the shard, the instruction, ...), yours beside the reference's. Hints are
shown only when you ask (`--hints`): they give much of an answer away.

Your functions have the same signature as minipar's own algorithms, so once they pass they can
power minipar itself: `minipar.exercises.register()` returns the names of those you wrote
(`minipar.all_reduce(x, algorithm="student_ring")`).
"""


def sources(solutions: Path | None = None) -> list[Path]:
    return sorted((solutions or tree("solutions")).glob("ex[0-9][0-9]_*.py"))


NO_HINT = "write this part (`minipar grade --hints` shows a hint)"


def strip(text: str, where: str = "solution", hints: bool = True) -> tuple[str, int]:
    """The exercise version of a solution file's text, and the number of blocks replaced;
    without hints every block raises the same bare message (for instructors who grade)."""
    out, blocks, lines, i = [], 0, text.splitlines(), 0
    while i < len(lines):
        begin = BEGIN.match(lines[i])
        if not begin:
            if END.match(lines[i]):
                raise ValueError(f"{where}:{i + 1}: END SOLUTION without a BEGIN")
            out.append(lines[i])
            i += 1
            continue
        hint = [begin["hint"] or ""]
        start, i = i, i + 1
        while i < len(lines) and HINT.match(lines[i]):
            hint.append(HINT.match(lines[i])["hint"])
            i += 1
        while i < len(lines) and not END.match(lines[i]):
            if BEGIN.match(lines[i]):
                raise ValueError(f"{where}:{i + 1}: BEGIN SOLUTION inside the block at {start + 1}")
            i += 1
        if i == len(lines):
            raise ValueError(f"{where}:{start + 1}: BEGIN SOLUTION is never closed")
        message = " ".join(h.strip() for h in hint if h.strip()) if hints else ""
        message = message or NO_HINT
        out.extend(_raise(begin["indent"], message))
        blocks += 1
        i += 1
    return "\n".join(out) + "\n", blocks


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _raise(indent: str, message: str) -> list[str]:
    """`raise NotImplementedError("message")`, the message wrapped to fit 100 columns."""
    one = f"{indent}raise NotImplementedError({_quoted(message)})"
    if len(one) <= 100:
        return [one]
    width = 100 - len(indent) - 8
    pieces = textwrap.wrap(message, width, drop_whitespace=False, break_on_hyphens=False)
    return [
        f"{indent}raise NotImplementedError(",
        *(f"{indent}    {_quoted(piece)}" for piece in pieces),
        f"{indent})",
    ]


def hints(name: str, solutions: Path | None = None) -> list[str]:
    """The hint of each part of exercise `name`, in order, from its solution's markers."""
    path = (solutions or tree("solutions")) / f"{name}.py"
    if not path.exists():
        return []
    found, lines = [], path.read_text().splitlines()
    for i, line in enumerate(lines):
        begin = BEGIN.match(line)
        if begin:
            parts = [begin["hint"] or ""]
            for more in lines[i + 1 :]:
                if not HINT.match(more):
                    break
                parts.append(HINT.match(more)["hint"])
            found.append(" ".join(p.strip() for p in parts if p.strip()))
    return found


def lesson_of(path: Path) -> str:
    return path.name[2:4]


def generated(path: Path, hints: bool = False) -> tuple[str, int]:
    """What exercises/<name> should contain, for solutions file `path`."""
    body, blocks = strip(path.read_text(), str(path), hints)
    modules, names = allowed_imports(path)
    said = sorted(modules) + sorted(f"{m}.{n}" for m, n in names)
    imports = ", ".join(said) or "none of minipar's"
    return HEADER.format(name=path.name, lesson=lesson_of(path), imports=imports) + body, blocks


def allowed_imports(solution: Path) -> tuple[set[str], set[tuple[str, str]]]:
    """(modules, (module, name) pairs) the worked answer imports: what its exercise may."""
    modules, names = set(), set()
    for node in ast.walk(ast.parse(solution.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update((node.module, alias.name) for alias in node.names)
    return modules, names


def expected_files(solutions: Path | None = None, hints: bool = False) -> dict[str, str]:
    """file name -> the text --generate writes (the README and one file per solution)."""
    files = {"README.md": README}
    for path in sources(solutions):
        files[path.name] = generated(path, hints)[0]
    return files


def stale(
    exercises: Path | None = None, solutions: Path | None = None, hints: bool = False
) -> list[str]:
    """Names of the files in exercises/ that differ from (or are missing against) the solutions."""
    exercises = exercises or tree("exercises")
    wrong = []
    for name, text in expected_files(solutions, hints).items():
        path = exercises / name
        if not path.exists() or path.read_text() != text:
            wrong.append(name)
    return wrong


def remaining(path: Path) -> int:
    """How many `raise NotImplementedError` lines a file still has (work left to do)."""
    return sum("raise NotImplementedError(" in line for line in path.read_text().splitlines())


def generate(exercises: Path | None = None, force: bool = False, hints: bool = False) -> list[str]:
    """Write exercises/ from solutions/; refuses to overwrite a file a student has started
    (fewer NotImplementedErrors than a fresh copy) unless force. Returns the files written.
    hints=True: each NotImplementedError carries its hint (the default: none, NO_HINT)."""
    exercises = exercises or tree("exercises")
    exercises.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in expected_files(hints=hints).items():
        path = exercises / name
        if path.exists() and path.read_text() == text:
            continue
        if path.exists() and not force and name != "README.md":
            fresh = text.count("raise NotImplementedError(")
            if remaining(path) < fresh:
                raise ValueError(
                    f"{path} has {fresh - remaining(path)} of {fresh} parts filled in (a "
                    "student's work?); use --force to overwrite it"
                )
        path.write_text(text)
        written.append(name)
    return written
