"""The student's side of the exercises: where they are, loading one, plugging one in.

    import minipar
    minipar.exercises.register()            # ["student_ring", ...]: what you wrote joins
                                            # minipar's algorithm tables
    minipar.all_reduce(x, algorithm="student_ring")
    minipar.exercises.load("ex03_ring_allreduce")    # a module of exercises/, by path

A student's functions keep the signatures of minipar's own algorithms, so a passing one powers
minipar itself. Generating exercises/ from solutions/ (`minipar exercises --generate`) and
grading them (`minipar grade`) are the course's: minipar/course/.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository, for an editable install
EDITION = "full"  # "student" in a course's hand-out (minipar course handout), where the library
# calls the student's exercises where its answers stood (minipar/course/handout.py)
EXERCISES_ENV = "MINIPAR_EXERCISES"  # the student edition's exercises/ folder, if not beside it

# what `register()` adds to minipar's algorithm tables: (exercise, function, collective, name)
PLUGS = [
    ("ex02_broadcast_linear", "broadcast_linear", "broadcast", "student_linear"),
    ("ex02_broadcast_binomial", "broadcast_binomial", "broadcast", "student_binomial"),
    ("ex03_ring_allreduce", "all_reduce_ring", "all_reduce", "student_ring"),
    (
        "ex03_recursive_doubling",
        "all_reduce_recursive_doubling",
        "all_reduce",
        "student_recursive_doubling",
    ),
    ("ex04_hierarchical_allreduce", "all_reduce_two_level", "all_reduce", "student_two_level"),
]


def repo_root() -> Path:
    """The minipar checkout: the current folder if it is one, else the one this package was
    installed from (pip install -e .)."""
    here = Path.cwd()
    try:
        if (here / "solutions").is_dir() and (here / "tests" / "test_exercises.py").is_file():
            return here
    except OSError:  # a folder this process may not read (the grader's unprivileged child)
        pass
    return ROOT


def tree(which: str) -> Path:
    """'exercises', 'solutions' (in the checkout) or a path to a folder of exercise files."""
    path = repo_root() / which if which in ("exercises", "solutions") else Path(which)
    return path.resolve()


_GUARDED: list = []  # this process installed the grader's audit hook (once is for good)
HIDE_ENV = "MINIPAR_GRADE_HIDE"  # os.pathsep-separated paths a student's code may not open
ISOLATE_ENV = "MINIPAR_GRADE_ISOLATE"  # "0": no namespace apart, the audit hook alone
COVER_ENV = "MINIPAR_GRADE_COVER"  # what the ranks' namespace covers (HIDE_ENV less the answers)
# events refused once a student's file is loaded: starting or replacing a process
REFUSED = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork")
REFUSED += ("os.forkpty", "pty.spawn")


def hidden_paths() -> list[str]:
    return [os.path.realpath(p) for p in os.environ.get(HIDE_ENV, "").split(os.pathsep) if p]


# covers each hidden path (a folder: an empty read-only tmpfs; a file: /dev/null), then runs
# the command with the privileges setpriv is given ("$1" up to "--" are the paths)
COVER = (
    'while [ "$1" != -- ]; do if [ -d "$1" ]; then mount -t tmpfs -o ro,size=4k none "$1"; '
    'elif [ -e "$1" ]; then mount --bind /dev/null "$1"; fi || exit 97; shift; done; shift; '
)
NOBODY = ("--reuid=65534", "--regid=65534", "--clear-groups")  # the unprivileged user
NO_CAPABILITIES = ("--bounding-set=-all", "--inh-caps=-all")  # root's uid, no root's powers


def apart(hidden: list[str], who: tuple = NO_CAPABILITIES) -> list[str]:
    """The command prefix that runs a process of a student's code apart, where this process
    is root: in a mount namespace of its own where each hidden path is covered, with `who`'s
    privileges (NOBODY, or root's uid without a capability: it cannot uncover them); [] where
    that cannot be (not root, no unshare or setpriv, MINIPAR_GRADE_ISOLATE=0)."""
    import shutil

    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if os.geteuid() != 0 or not (unshare and setpriv) or os.environ.get(ISOLATE_ENV) == "0":
        return []
    script = COVER + f"exec {setpriv} {' '.join(who)} " + '"$@"'
    return [unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            *hidden, "--"]  # fmt: skip


def runs(prefix: list[str]) -> bool:
    """Whether this machine runs this Python under `prefix` (a container may refuse the
    namespace; `nobody` may not reach this Python); asked once a process per prefix."""
    if not prefix:
        return False
    key = tuple(prefix)
    if key not in _RUNS:
        _RUNS[key] = _runs(prefix)
    return _RUNS[key]


_RUNS: dict = {}  # prefix -> whether it runs this Python (runs())


def _runs(prefix: list[str]) -> bool:
    import subprocess
    import sys

    try:
        done = subprocess.run([*prefix, sys.executable, "-c", "import minipar"], timeout=30,
                              capture_output=True)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def guard(hidden: list[str] | None = None) -> None:
    """Refuse, in this process from now on, opening anything under `hidden` (default: what
    HIDE_ENV names: the worked answers, the hidden tests, the results) and starting or
    replacing a process. An audit hook (PEP 578): nothing can take it back. The grader's wall
    (course/sandbox.py) puts it in every process that runs a student's file."""
    import sys

    hidden = hidden_paths() if hidden is None else hidden

    def refuse(event, args):
        if event == "open" and hidden and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if any(path == h or path.startswith(h + os.sep) for h in hidden):
                raise PermissionError(f"the grader hides {os.fsdecode(args[0])}")
        elif event.startswith(REFUSED):
            raise PermissionError(f"{event}: refused while grading")

    sys.addaudithook(refuse)


def load(name: str, which: str = "exercises"):
    """Import exercise module `name` (e.g. 'ex03_ring_allreduce') from a tree, by path. While
    grading (HIDE_ENV set), a student's file is loaded only after `guard()`."""
    path = tree(which) / f"{name}.py"
    if not path.exists():
        raise FileNotFoundError(f"no exercise {name} in {path.parent}")
    trusted = path.parent == tree("solutions")  # the worked answers: the grader's own
    if not trusted and os.environ.get(HIDE_ENV) and not _GUARDED:
        guard()  # a process about to run a student's file: the answers are out of reach
        _GUARDED.append(True)
    spec = importlib.util.spec_from_file_location(f"minipar_{path.parent.name}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ExerciseNotDone(NotImplementedError):
    """The student edition's library reached an exercise the student has not written yet."""


def assigned(name: str):
    """The student's exercise `name`, as the student edition's library calls it where the
    answer was cut: each function runs the student's; one still unwritten raises
    ExerciseNotDone naming the exercise and how to grade it."""
    folder = Path(os.environ.get(EXERCISES_ENV) or ROOT / "exercises")
    path = folder / f"{name}.py"
    if not path.exists():
        raise ExerciseNotDone(
            f"this part of minipar is your exercise {name}, and {path} is missing: copy it back "
            f"from the hand-out (or set {EXERCISES_ENV} to your exercises/ folder)"
        )
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _LOADED:  # once per version of the file: a collective calls it every time
        _LOADED[key] = load(name, str(folder))
    return _Assigned(_LOADED[key], name)


_LOADED: dict = {}  # (path, mtime) -> the student's module, for assigned()


class _Assigned:
    def __init__(self, module, name: str):
        self._module, self._name = module, name

    def __getattr__(self, function: str):
        fn = getattr(self._module, function)

        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ExerciseNotDone:
                raise
            except NotImplementedError as error:
                raise ExerciseNotDone(
                    f"minipar runs your exercise {self._name} here ({function}), which is not "
                    f"finished: {error}; write it, then `minipar grade {self._name}`"
                ) from None

        return run


def written(fn) -> bool:
    """Whether a student wrote `fn`: its source no longer raises NotImplementedError (a fresh
    exercise's parts each do)."""
    import inspect

    try:
        return "raise NotImplementedError(" not in inspect.getsource(fn)
    except (OSError, TypeError):  # no source to read: take it as written
        return True


def register(which: str = "exercises") -> list[str]:
    """Add the student's algorithms to minipar's tables; returns their names, each what
    `algorithm=` takes (`minipar.all_reduce(x, algorithm="student_ring")`). Only what the
    student wrote is added: an exercise whose function still raises NotImplementedError, or
    whose file the folder lacks (a folder may hold only the exercises being graded), is left
    out, and so is one whose file does not load (a syntax error in one exercise costs no other
    exercise its plug). Call it on every rank before using them."""
    from minipar.collectives import registry  # here: the grader's face needs no numpy or MPI

    names = []
    for exercise, function, collective, name in PLUGS:
        if not (tree(which) / f"{exercise}.py").exists():
            continue
        try:
            fn = getattr(load(exercise, which), function)
        except Exception:  # noqa: BLE001 - that exercise's own tests say what is wrong with it
            continue
        if written(fn):
            registry.register_algorithm(collective, name, fn)
            names.append(name)
    return names
