"""The package's layers: every module imports only from its own layer or the ones below, and no
two modules import each other, directly or round a loop.

The table below is the house plan (the README's map draws it). Each import of a minipar module,
at the top of a file or inside a function, is read with `ast` (relative forms resolved,
`importlib.import_module("...")` with a constant included) and its layer looked up by the
longest matching prefix. The facade (`minipar/__init__.py`, `import minipar`) is a layer of its
own: its lazy tables name what it loads, so it sits above the library it fronts, and only the
programs above it (bench, the test harness, the course, the command line) use it, as a
student's script does. An import inside a function is allowed only where it keeps a heavy
module (torch, numpy, mpi4py, ...) out of an importer that does not load it otherwise.
"""

from __future__ import annotations

import ast
from pathlib import Path

import minipar

ROOT = Path(minipar.__file__).parent

LAYERS = [  # bottom up: (name, module prefixes)
    ("foundations", ("minipar.errors", "minipar.state", "minipar.term")),
    ("cost", ("minipar.cost",)),
    ("comm", ("minipar.comm",)),
    ("runtime", ("minipar.runtime",)),
    ("launcher", ("minipar.launcher",)),
    ("collectives", ("minipar.collectives",)),
    ("parallel", ("minipar.parallel",)),
    ("models", ("minipar.models",)),
    ("planning", ("minipar.planning",)),
    ("simulate", ("minipar.simulate",)),
    ("facade", ("minipar", "minipar.exercises")),
    ("bench", ("minipar.bench",)),
    ("testing", ("minipar.testing",)),
    ("course", ("minipar.course",)),
    ("cli", ("minipar.cli", "minipar.__main__")),
]
HEAVY = ("torch", "numpy", "mpi4py", "rich", "matplotlib", "cloudpickle")


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest prefix that names `module` (or a package above it)."""
    best, at = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, at = len(prefix), i
    if at is None:
        raise AssertionError(f"{module} is in no layer of tests/test_layers.py's table")
    return at


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its __init__)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known) -> list[tuple[int, str, bool]]:
    """(line, minipar module imported, inside a function?) for each import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    found = []
    for node in ast.walk(tree):
        for target in _targets(node, package, known):
            if target == "minipar" or target.startswith("minipar."):
                found.append((node.lineno, target, id(node) in in_function))
    return found


def _targets(node, package: str, known) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*parts, *([base] if base else [])])
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
        return subs if len(subs) == len(node.names) else [base, *subs]
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
        if node.args and isinstance(node.args[0], ast.Constant):
            return [str(node.args[0].value)]
    return []


def _lazy_targets(path: Path) -> list[tuple[int, str]]:
    """The modules the facade's lazy tables name (`_LAZY`, `_SUBMODULES`: loaded on access)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if names & {"_LAZY", "_SUBMODULES"}:
                found += [(v.lineno, v.value) for v in node.value.values]
    return found


def graph() -> dict[str, list[tuple[int, str, bool]]]:
    known = modules()
    edges = {}
    for name, path in known.items():
        resolved = []
        for line, target, inner in imports_of(name, path, known):
            while target not in known and "." in target:
                target = target.rpartition(".")[0]  # `from pkg import name`: the package
            resolved.append((line, target, inner))
        edges[name] = resolved
    return edges


def upward(edges) -> list[str]:
    problems = []
    for name, targets in edges.items():
        mine = layer_of(name)
        for line, target, _ in targets:
            theirs = layer_of(target)
            if theirs > mine:
                problems.append(
                    f"{name}:{line} imports {target}: layer {LAYERS[mine][0]} reaches up to "
                    f"layer {LAYERS[theirs][0]}"
                )
    return problems


def cycles(edges) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), and self-imports."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for _, w, _ in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or any(t == v for _, t, _ in edges.get(v, ())):
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def heavy_closure(edges, heavy_direct) -> dict[str, set]:
    """The heavy modules each module loads when imported: its top-level imports and its parent
    packages' (importing a.b.c runs a/__init__ and a/b/__init__ first), transitively."""

    def loaded_by(name: str) -> list[str]:
        parents = [name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)]
        return [t for _, t, inner in edges.get(name, ()) if not inner] + parents

    closure = {}
    for start in edges:
        seen, todo = {start}, [start]
        while todo:
            for target in loaded_by(todo.pop()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        closure[start] = set().union(*(heavy_direct.get(m, set()) for m in seen))
    return closure


def top_level_heavy(path: Path) -> set:
    """The heavy third-party modules a file imports at its top level (outside functions)."""
    tree = ast.parse(path.read_text())
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner.update(id(n) for n in ast.walk(node) if n is not node)
    got = set()
    for node in ast.walk(tree):
        if id(node) in inner:
            continue
        if isinstance(node, ast.Import):
            got |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            got.add(node.module.split(".")[0])
    return got & set(HEAVY)


def needless_inner(edges, known) -> list[str]:
    """Function-level imports of minipar modules that defer nothing heavy."""
    direct = {name: top_level_heavy(path) for name, path in known.items()}
    loads = heavy_closure(edges, direct)
    problems = []
    for name, targets in edges.items():
        for line, target, inner in targets:
            if inner and not (loads[target] - loads[name]):
                problems.append(
                    f"{name}:{line} imports {target} inside a function, but that defers nothing "
                    f"heavy ({name} loads {sorted(loads[name]) or 'nothing heavy'} already, "
                    f"{target} {sorted(loads[target]) or 'nothing heavy'}): import it at the top"
                )
    return problems


# -- the tests ------------------------------------------------------------------------------------


def test_every_module_is_in_a_layer():
    for name in modules():
        layer_of(name)


def test_no_module_imports_a_layer_above_its_own():
    problems = upward(graph())
    assert not problems, "imports that climb up a layer:\n" + "\n".join(problems)


def test_the_facade_loads_only_what_lies_below_it():
    facade = layer_of("minipar")
    problems = [
        f"minipar/__init__.py:{line} loads {target} (layer {LAYERS[layer_of(target)][0]})"
        for line, target in _lazy_targets(ROOT / "__init__.py")
        if layer_of(target) > facade
    ]
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(group) for group in found)


def test_imports_inside_functions_defer_something_heavy():
    known = modules()
    problems = needless_inner(graph(), known)
    assert not problems, "\n".join(problems)


def test_imports_inside_functions_say_why():
    """Each such import (or the comment line above its group) says what it keeps out."""
    problems = []
    for name, path in modules().items():
        lines = path.read_text().splitlines()
        for line, _, inner in imports_of(name, path, modules()):
            if not inner:
                continue
            above = line - 2
            while above >= 0 and lines[above].lstrip().startswith(("from ", "import ")):
                above -= 1  # the group of imports this one belongs to
            said = "#" in lines[line - 1] or (above >= 0 and lines[above].lstrip().startswith("#"))
            if not said:
                problems.append(f"{name}:{line}: {lines[line - 1].strip()}")
    assert not problems, "imports inside functions without a comment:\n" + "\n".join(problems)


def test_no_module_imports_another_modules_private_names():
    problems = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minipar"):
                hidden = [a.name for a in node.names if a.name.startswith("_") and a.name != "*"]
                hidden = [h for h in hidden if not h.startswith("__")]
                if hidden:
                    problems.append(f"{name}:{node.lineno} imports {hidden} from {node.module}")
    assert not problems, "\n".join(problems)


def test_the_root_holds_few_modules():
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(loose) <= 6, f"the package root holds {len(loose)} modules: {loose}"


def test_the_checks_catch_what_they_are_for():
    """Planted: an upward import, a cycle, a needless function-level import (each must be seen)."""
    edges = {
        "minipar.comm.transport.base": [(3, "minipar.collectives.api", False)],
        "minipar.collectives.api": [(5, "minipar.comm.transport.base", False)],
        "minipar.cost.model": [(9, "minipar.cost.links", True)],
        "minipar.cost.links": [],
    }
    assert any("layer comm reaches up to layer collectives" in p for p in upward(edges))
    assert cycles(edges) == [["minipar.collectives.api", "minipar.comm.transport.base"]]
    known = {
        "minipar.cost.model": ROOT / "cost" / "model.py",
        "minipar.cost.links": ROOT / "state.py",
    }
    assert needless_inner({k: edges[k] for k in known}, known)
    assert layer_of("minipar.parallel.tensor.linear") == layer_of("minipar.parallel")
    assert layer_of("minipar.exercises") == layer_of("minipar") > layer_of("minipar.planning")
    tree = ast.parse("def f():\n    from ..comm import base\n")
    assert [t for n in ast.walk(tree) for t in _targets(n, "minipar.collectives", {})] == [
        "minipar.comm"
    ]
