"""What a submitted exercise may use: its imports and names, checked before any of it runs.

Each exercise's answer may import what its worked answer imports (the ring: `layout`,
`reduce_op`, `buffers`) and a few plain modules (math, itertools, numpy, torch, ...), nothing
else: not `minipar.collectives.ring` (the library's own answer), not `mpi4py` (MPI's own
collectives), not `os` or `importlib`. Some names reach past any import list, so they are refused
too: `open`, `exec`, `eval`, `getattr`, `__import__`, any attribute starting with `_` (dunders
walk from any object to the interpreter's internals), the transport underneath a `call`
(`.comm`), files (`np.load`, `torch.save`), and `torch.distributed`; a minipar module may be
used only by its own attributes, never to reach another module (`buffers.sys`, `minipar.cli`).

    found = policy.check(path, "ex03_ring_allreduce")   # [] or ["ex03_ring_allreduce.py:12: ..."]

The check reads the file, never runs it: a syntax error is reported the same way, with its line.
It is the first of the grader's walls (docs/course.md): the others are the processes the code
runs in, which hold no grader state and cannot read the answers, the hidden tests or the results.
"""

from __future__ import annotations

import ast
from pathlib import Path

from minipar.course import exercises
from minipar.course.exercises import allowed_imports

# modules any exercise may import, whole or in part (pure computation)
COMMON = {
    "math", "cmath", "itertools", "functools", "collections", "operator", "typing",
    "dataclasses", "heapq", "bisect", "statistics", "numbers", "enum", "__future__",
    "numpy", "torch", "torch.nn", "torch.nn.functional",
}  # fmt: skip
# names that run code, read files or reach the interpreter, whatever was imported
NAMES = {
    "open", "exec", "eval", "compile", "__import__", "getattr", "setattr", "delattr",
    "globals", "locals", "vars", "breakpoint", "input", "exit", "quit", "help", "memoryview",
    "__builtins__", "__loader__", "__spec__", "__file__",
}  # fmt: skip
# attributes that leave the exercise's world: the MPI underneath, files, processes, the grader
ATTRIBUTES = {
    "comm", "mpi", "distributed", "multiprocessing", "hub", "cpp_extension", "ctypeslib",
    "load", "loads", "save", "savez", "savez_compressed", "savetxt", "loadtxt", "genfromtxt",
    "fromfile", "tofile", "memmap", "system", "popen", "environ", "modules", "exercises",
    "course", "cli", "testing", "launcher", "register_algorithm", "f_globals", "f_locals",
    "f_back", "gi_frame", "cr_frame", "tb_frame", "MPI", "COMM_WORLD", "COMM_SELF",
}  # fmt: skip


def _import_ok(module: str, name: str | None, allowed) -> bool:
    modules, names = allowed
    if module in COMMON or module in modules:
        return True
    if name is None:
        return False
    return (module, name) in names or f"{module}.{name}" in modules | COMMON


def _docstrings(tree) -> set[int]:
    """ids of the constant nodes that are docstrings (free to mention anything)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _bound_modules(tree) -> dict[str, str]:
    """name -> the minipar module an import binds it to (`import minipar`, `from
    minipar.collectives import layout`): their attributes are checked one by one."""
    import importlib  # the library's own modules, in the grader's process: never student code

    bound = {}
    for node in ast.walk(tree):
        aliases = node.names if isinstance(node, (ast.Import, ast.ImportFrom)) else []
        for alias in aliases:
            full = alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
            if not full.startswith("minipar"):
                continue
            try:
                importlib.import_module(full)
            except ImportError:
                continue  # a function or class of a module, not a module
            bound[alias.asname or alias.name.split(".")[0]] = (
                full if alias.asname or isinstance(node, ast.ImportFrom) else full.split(".")[0]
            )
    return bound


def _through_module(node, bound) -> str | None:
    """`buffers.sys`, `minipar.collectives`: a module reached through an allowed module's
    attribute is a way around the import list."""
    import importlib  # as above
    import types

    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
        return None
    module = bound.get(node.value.id)
    if module is None:
        return None
    value = getattr(importlib.import_module(module), node.attr, None)
    if isinstance(value, types.ModuleType):
        return f"{node.value.id}.{node.attr}: a module reached through {module}, refused"
    return None


def _refusal(node, allowed, docstrings) -> str | None:
    """Why `node` may not stand in an exercise, or None."""
    if isinstance(node, ast.Import):
        bad = [a.name for a in node.names if not _import_ok(a.name, None, allowed)]
        return f"import {', '.join(bad)}: not one of this exercise's modules" if bad else None
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return "a relative import: not one of this exercise's modules"
        bad = [a.name for a in node.names if not _import_ok(node.module, a.name, allowed)]
        if bad:
            return f"from {node.module} import {', '.join(bad)}: not one of this exercise's modules"
        return None
    if isinstance(node, ast.Name) and (node.id in NAMES or node.id.startswith("__")):
        return f"{node.id}: the grader refuses it in an exercise"
    if isinstance(node, ast.Attribute) and (node.attr.startswith("_") or node.attr in ATTRIBUTES):
        return f".{node.attr}: the grader refuses it in an exercise"
    if isinstance(node, ast.Global):
        return "global: an exercise keeps its state in its arguments"
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__" in node.value:
        return None if id(node) in docstrings else "a string holding '__': refused in an exercise"
    return None


def check_text(text: str, filename: str, allowed, given: frozenset = frozenset()) -> list[str]:
    """Every refusal in a submitted file's text, as 'FILE:LINE: what' (a syntax error too);
    a line standing as it is in the hand-out's stub (`given`) was written by the course."""
    try:
        tree = ast.parse(text, filename=filename)
    except SyntaxError as error:
        where = f"{filename}:{error.lineno}" if error.lineno else filename
        return [f"{where}: SyntaxError: {error.msg} (the file does not parse)"]
    docstrings, lines, bound = _docstrings(tree), text.splitlines(), _bound_modules(tree)
    bases = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    found = []
    for node in ast.walk(tree):
        why = _refusal(node, allowed, docstrings) or _through_module(node, bound)
        if not why and isinstance(node, ast.Name) and node.id in bound and id(node) not in bases:
            if isinstance(node.ctx, ast.Load):  # `b = buffers`: its attributes go unchecked
                why = f"{node.id}: a module used other than by its attributes, refused"
        line = lines[node.lineno - 1].strip() if why and 0 < node.lineno <= len(lines) else ""
        if why and line not in given:
            found.append((getattr(node, "lineno", 0), f"{filename}:{node.lineno}: {why}"))
    return [line for _, line in sorted(set(found))]


def check(path: Path, exercise: str, solutions: Path) -> list[str]:
    """The refusals in a student's `path` for `exercise`, judged against its worked answer's
    imports (solutions/EXERCISE.py): [] when the file may run."""
    solution = solutions / f"{exercise}.py"
    given = frozenset(line.strip() for line in exercises.generated(solution)[0].splitlines())
    text = Path(path).read_text(errors="replace")
    return check_text(text, Path(path).name, allowed_imports(solution), given)
