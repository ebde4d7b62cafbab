"""The student edition: what a course hands out, without the answers (`minipar course handout`).

    minipar course handout DIR                    every exercise assigned
    minipar course handout DIR --exercises 03,07  only lessons 03 and 07's (or exercises by name)

One source, two editions. The repository is the full edition: the library holds every answer,
read top to bottom. Where an exercise's answer stands in the library, the library's own file
marks it, as solutions/ marks a worked answer:

    | def all_reduce_ring(call, x, op) -> None:
    |     \"\"\"...\"\"\"
    |     # BEGIN ANSWER ex03_ring_allreduce
    |     edges = layout.bounds(len(x), call.size)
    |     ...
    |     # END ANSWER

and the hand-out cuts the block. In its place the library calls the student's exercise, with the
enclosing function's own arguments: `return assigned("ex03_ring_allreduce").all_reduce_ring(call,
x, op)` (minipar.exercises.assigned: until the exercise is written, it says which one to finish).
A marker may name another of the exercise's functions (`# BEGIN ANSWER ex12_... best_interval`),
a stand-in that is not the answer (`# BEGIN ANSWER ex03_... standin: reduce_scatter_inplace`, a
function of collectives/standins.py: the ring's phases reused by other algorithms keep working,
by other messages), or a statement of its own (`do: compute = list(assigned(...)...)`, continued
on `# more: ...` lines). So the two editions cannot drift: the answer is written once, and a test
holds the hand-out to containing none of solutions/' answer lines.

What the hand-out holds: the package (cut), setup files, README, exercises/ (the assigned
exercises' stubs), lessons/ and docs/ (their pointers to a cut file pointed at the exercise
instead); not solutions/, tests/ (the grader's), the instructors' docs, CI or scripts.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from minipar.course import exercises

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN ANSWER (?P<exercise>ex\d\d_\w+)(?:\s+(?P<how>.+))?$")
END = re.compile(r"^\s*# END ANSWER\s*$")
MORE = re.compile(r"^\s*# more: (?P<text>.*)$")  # a marker's statement, continued
IMPORT = "from minipar.exercises import ExerciseNotDone, assigned  # the student edition: yours"
STANDINS = "from minipar.collectives import standins  # the student edition: not the answers"
COPIED = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE")
INSTRUCTORS = ("course.md",)  # docs/ pages for instructors only


def choose(wanted: str | None, names: list[str]) -> list[str]:
    """The assigned exercises: every one, or the lessons' / names in 'wanted' (03,ex07_x)."""
    if not wanted:
        return list(names)
    chosen = []
    for item in (w.strip() for w in wanted.split(",") if w.strip()):
        hits = [n for n in names if n.startswith(f"ex{int(item):02d}_")] if item.isdigit() else (
            [item] if item in names else [])  # fmt: skip
        if not hits:
            raise ValueError(f"--exercises {item}: no such lesson or exercise (one of {names})")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def _signature_call(function: ast.FunctionDef) -> str:
    """'call, x, op' for `def f(call, x, op)`: the arguments passed on, as they came."""
    a = function.args
    parts = [arg.arg for arg in a.posonlyargs + a.args]
    parts += [f"*{a.vararg.arg}"] if a.vararg else []
    parts += [f"{arg.arg}={arg.arg}" for arg in a.kwonlyargs]
    parts += [f"**{a.kwarg.arg}"] if a.kwarg else []
    return ", ".join(parts)


def _enclosing(tree: ast.Module, line: int) -> ast.FunctionDef:
    """The innermost function whose body holds 1-based `line`."""
    found = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.lineno < line <= (node.end_lineno or node.lineno):
                if found is None or node.lineno > found.lineno:
                    found = node
    if found is None:
        raise ValueError(f"line {line}: an ANSWER block must stand inside a function")
    return found


def cut(text: str, assigned: set[str], where: str = "file") -> tuple[str, list[str]]:
    """`text` with the ANSWER blocks of assigned exercises replaced by the call to the
    student's exercise (or the stand-in the marker names); the exercises cut, in order."""
    tree, lines = ast.parse(text), text.splitlines()
    out, done, i, needs = [], [], 0, set()
    while i < len(lines):
        begin = BEGIN.match(lines[i])
        if not begin:
            if END.match(lines[i]):
                raise ValueError(f"{where}:{i + 1}: END ANSWER without a BEGIN")
            out.append(lines[i])
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if END.match(lines[j])), None)
        if end is None:
            raise ValueError(f"{where}:{i + 1}: BEGIN ANSWER is never closed")
        exercise, how = begin["exercise"], (begin["how"] or "").strip()
        while i + 1 < end and MORE.match(lines[i + 1]):
            i += 1
            how += " " + MORE.match(lines[i])["text"].strip()
        if exercise not in assigned:
            out.extend(lines[i + 1 : end])  # the answer stays: not this course's exercise
        else:
            function = _enclosing(tree, i + 1)
            args = _signature_call(function)
            if how.startswith("do:"):  # a statement of its own (a generator's, a planted bug's)
                needs |= {IMPORT}
                out.append(f"{begin['indent']}{how.split(':', 1)[1].strip()}")
            elif how.startswith("standin:"):
                target, needs = f"standins.{how.split(':', 1)[1].strip()}", needs | {STANDINS}
                out.append(f"{begin['indent']}return {target}({args})")
            else:
                target, needs = f'assigned("{exercise}").{how or function.name}', needs | {IMPORT}
                out.append(f"{begin['indent']}return {target}({args})")
            done.append(exercise)
        i = end + 1
    return _with_imports(out, tree, sorted(needs)), done


def _with_imports(lines: list[str], tree: ast.Module, imports: list[str]) -> str:
    """The lines with `imports` added after the module's last top-level import."""
    if imports:
        last = max((n.end_lineno for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))),
                   default=0)  # fmt: skip
        lines = lines[:last] + imports + lines[last:]
    return "\n".join(lines) + "\n"


def answer_texts(package: Path) -> dict[str, str]:
    """exercise -> the library's answer to it: the lines of its ANSWER blocks, every file's."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        exercise = None
        for line in path.read_text().splitlines():
            begin = BEGIN.match(line)
            if begin:
                exercise = begin["exercise"]
            elif END.match(line):
                exercise = None
            elif exercise and not MORE.match(line):
                found.setdefault(exercise, []).append(line)
    return {exercise: "\n".join(lines) for exercise, lines in found.items()}


def build(dest: Path, wanted: str | None = None, root: Path | None = None) -> dict:
    """Write the student edition into `dest` (which must not exist or be empty); returns what
    was assigned and cut: {"exercises": [...], "cut": {exercise: [files]}}."""
    root = root or exercises.repo_root()
    solutions = root / "solutions"
    names = [p.stem for p in exercises.sources(solutions)]
    chosen = choose(wanted, names)
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise ValueError(f"{dest} is not empty: the hand-out goes into a new folder")
    homes: dict[str, list[str]] = {}
    for path in sorted((root / "minipar").rglob("*.py")):
        relative = path.relative_to(root)
        text, done = cut(path.read_text(), set(chosen), str(relative))
        _write(dest / relative, text.replace('EDITION = "full"', 'EDITION = "student"', 1))
        for exercise in done:
            homes.setdefault(exercise, []).append(str(relative))
    for path in (root / "minipar").rglob("*"):
        if path.is_file() and path.suffix not in (".py", ".pyc"):
            _write(dest / path.relative_to(root), path.read_bytes())
    for name in COPIED:
        if (root / name).exists():
            _write(dest / name, (root / name).read_bytes())
    _write_exercises(dest / "exercises", solutions, chosen)
    for folder in ("lessons", "docs"):
        for path in sorted((root / folder).rglob("*")):
            if not path.is_file() or path.name in INSTRUCTORS:
                continue
            if path.suffix == ".md":
                text = pointed(path.read_text(), homes, path.name[:2])
                _write(dest / path.relative_to(root), text)
            else:
                _write(dest / path.relative_to(root), path.read_bytes())
    return {"exercises": chosen, "cut": homes}


def _write(path: Path, content) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def _write_exercises(folder: Path, solutions: Path, chosen: list[str]) -> None:
    _write(folder / "README.md", exercises.README)
    for name in chosen:
        _write(folder / f"{name}.py", exercises.generated(solutions / f"{name}.py")[0])


def pointed(text: str, homes: dict[str, list[str]], lesson: str) -> str:
    """A lesson's text with each mention (in backticks) of a file that held the answer to one
    of its own exercises told where that answer is now: the student's exercise."""
    for exercise, files in homes.items():
        if exercise[2:4] != lesson:
            continue
        for relative in dict.fromkeys(files):
            inside = relative.removeprefix("minipar/")
            for form in dict.fromkeys((relative, inside, Path(relative).name)):
                text = text.replace(
                    f"`{form}`",
                    f"`{form}` (its answer to {exercise} is yours: `exercises/{exercise}.py`)",
                )
    return text
