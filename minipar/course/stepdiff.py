"""The first wrong step: a student's algorithm beside the worked solution, message by message.

    run = stepdiff.graded(students_ring, reference=solutions_ring, phases=("reduce-scatter",
                          "all-gather"))
    with stepdiff.explaining() as session:
        minipar.all_reduce(x, algorithm=run)     # runs the reference too, on a copy of x
    notes = group.allgather_object(stepdiff.notes(session))
    print(stepdiff.explanation(notes))           # None when both did the same thing

Inside an `explaining()` block, each call of a `graded` algorithm first runs the reference on
copies of the same inputs, then the student's code on the real ones, each through a `Recorder`
that stands in for the algorithm's `Call`. A Recorder passes every call through and notes, per
step (`call.rounds`), each message: send or receive, peer, bytes and which part of which argument
it came from or went into (found from the buffer's address: `x[4:8]`, chunk 1 of the
`layout.bounds` cut), plus a copy of the arguments after each step and the messages still pending
when a wait failed (a deadlock). The ranks then pool their notes and `explanation` names the
first step where the two part: a message that differs, is extra or missing, or (when every
message matched) the first element that holds something else after a step.

The reference's messages are kept out of the trace ledger (`ledger.paused`), so ledger checks see
only the student's. The reference takes its own Call, so its messages never meet the student's.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from dataclasses import dataclass, field

from minipar.collectives import layout
from minipar.collectives.call import Call
from minipar.comm.trace import ledger
from minipar.comm.transport import buffers
from minipar.comm.transport.base import abandon
from minipar.course import stopping
from minipar.state import process

SENTINEL = "-- where it parts from the reference --"
OFF_COURSE = 1.0  # seconds a wait on a message the reference does not post may last
END = 1 << 62  # the step key of the snapshot taken when the algorithm returns


class OffCourse(AssertionError):
    """A rank waited on a message the reference never posts at that step."""

    says_where = True  # reported by its message alone (stopping.first_line)


class ExplainedError(AssertionError):
    """A failed case, with the first step where the student's run parted from the reference."""


# -- what a recorder notes ---------------------------------------------------------------------


@dataclass(frozen=True)
class Where:
    """Which part of which argument a message's buffer is (name "" for a buffer of its own)."""

    name: str
    start: int
    stop: int
    chunk: int | None = None
    whole: bool = False
    within: int | None = None  # the chunk a smaller piece lies in

    def describe(self, nbytes: int) -> str:
        size = _fmt_bytes(nbytes)
        if not self.name:
            return f"{size} (a buffer of its own)"
        if self.whole:
            return f"all of {self.name} ({size})"
        part = f"{self.name}[{self.start}:{self.stop}]"
        if self.chunk is not None:
            return f"chunk {self.chunk} ({part}, {size})"
        inside = f"in chunk {self.within}, " if self.within is not None else ""
        return f"{part} ({inside}{size})"


@dataclass(frozen=True)
class Message:
    step: int
    kind: str  # "send" or "recv"
    peer: int
    nbytes: int
    where: Where

    def key(self):
        return (self.kind, self.peer, self.nbytes, self.where)

    def said(self, present: bool = False) -> str:
        """'sent chunk 1 (x[4:8], 32 B) to rank 1' (past) or 'sends ...' (present)."""
        if self.kind == "send":
            verb, prep = ("sends" if present else "sent"), "to"
        else:
            verb, prep = ("receives" if present else "received"), "from"
        return f"{verb} {self.where.describe(self.nbytes)} {prep} rank {self.peer}"


def _fmt_bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} B"


def _address(buf) -> int:
    return buf.data_ptr() if buffers.is_torch(buf) else buf.__array_interface__["data"][0]


def locate(buf, bases: dict, p: int) -> Where:
    """Where `buf` lies in the algorithm's arguments (`bases`: name -> flat buffer)."""
    size = buffers.numel(buf)
    for name, base in bases.items():
        n, item = buffers.numel(base), buffers.itemsize(base)
        if buffers.itemsize(buf) != item or buffers.is_torch(buf) != buffers.is_torch(base):
            continue
        offset, rest = divmod(_address(buf) - _address(base), item)
        if rest or offset < 0 or offset + size > n:
            continue
        if offset == 0 and size == n and n:
            return Where(name, 0, n, whole=True)
        edges = layout.bounds(n, p)
        hits = [c for c in range(p) if (edges[c], edges[c + 1]) == (offset, offset + size)]
        if hits:
            return Where(name, offset, offset + size, hits[0])
        inside = [c for c in range(p) if edges[c] <= offset and offset + size <= edges[c + 1]]
        return Where(name, offset, offset + size, None, within=inside[0] if inside else None)
    return Where("", 0, size)


def _copy(x):
    return x.clone() if buffers.is_torch(x) else x.copy()


def _is_buffer(x) -> bool:
    import numpy as np

    return isinstance(x, np.ndarray) or buffers.is_torch(x)


class Recorder:
    """Stands in for an algorithm's Call: passes everything through, noting each message (step,
    peer, bytes, where in the arguments), the arguments after each step, and what was still
    pending when a wait failed. Attributes it does not define (comm, tag, ...) are the Call's."""

    def __init__(self, call, bases: dict, parts: int | None = None):
        self._call, self.bases = call, bases
        self.rank, self.size = call.rank, call.size
        self.parts = parts or call.size  # "chunk c" is the c-th of this many (layout.bounds)
        self.messages: list[Message] = []
        self.phases: list[tuple[int, int]] = []  # (first step, steps) of each call.rounds()
        self.snapshots: dict[int, dict] = {}  # step -> name -> copy of that argument after it
        self.pending: list[Message] = []
        self.error = ""
        self._posted: dict[int, tuple] = {}
        self.reference: Recorder | None = None  # the reference's run, once it is done
        self.phase_names: tuple = ()
        self.node_of = _nodes_of(call.comm)  # now: the map may be a test's, set for the call

    def __getattr__(self, name):
        return getattr(self._call, name)

    def rounds(self, n: int):
        self.phases.append((self._call.step, n))
        for i in self._call.rounds(n):
            yield i
            self.snapshots[self._call.step] = self._snapshot()

    def finish(self) -> None:
        self.snapshots[END] = self._snapshot()

    def _snapshot(self) -> dict:
        return {name: _copy(base) for name, base in self.bases.items()}

    def _post(self, kind: str, peer: int, buf, post):
        message = Message(self._call.step, kind, peer, buffers.nbytes(buf), self._where(buf))
        self.messages.append(message)
        request = post(buf, peer)
        self._posted[id(request)] = (request, message)
        return request

    def _where(self, buf) -> Where:
        return locate(buf, self.bases, self.parts)

    def isend(self, buf, dst: int):
        return self._post("send", dst, buf, self._call.isend)

    def irecv(self, buf, src: int):
        return self._post("recv", src, buf, self._call.irecv)

    def wait(self, requests) -> None:
        requests = list(requests)
        try:
            self._off_course(requests)
            self._call.wait(requests)
        except Exception:
            self.pending += [
                self._posted[id(r)][1] for r in requests if id(r) in self._posted and not r.done
            ]
            raise

    def _off_course(self, requests) -> None:
        """A wait that lasts OFF_COURSE seconds on a message the reference does not post at
        that step will never end well: raise OffCourse at once, naming it (and the others stop,
        course/stopping.py), rather than wait out the timeout. A wait on the reference's own
        messages (a true deadlock, a slow peer) is left to the timeout."""
        if self.reference is None:
            return
        start = time.monotonic()
        while time.monotonic() - start < OFF_COURSE:
            if all(r.test() for r in requests):
                return
            time.sleep(0.005)
        for r in requests:
            if id(r) not in self._posted or r.test():
                continue
            message = self._posted[id(r)][1]
            theirs = [m for m in _at(self.reference.messages, message.step)]
            if message.key() in [m.key() for m in theirs]:
                continue
            abandon([q for q in requests if not q.test()])
            label = _label(self.reference.phases, self.phase_names, message.step)
            same = [m for m in theirs if m.kind == message.kind] or theirs
            what = f"the reference {same[0].said(True)}" if same else "the reference posts nothing"
            raise OffCourse(
                f"{label}: rank {self.rank} {message.said()} and waited {OFF_COURSE:g} s for it; "
                f"{what} (a message nobody will match)"
            )

    def send(self, buf, dst: int) -> None:
        self.wait([self.isend(buf, dst)])

    def recv(self, buf, src: int) -> None:
        self.wait([self.irecv(buf, src)])

    def sendrecv(self, sendbuf, dst: int, recvbuf, src: int) -> None:
        self.wait([self.irecv(recvbuf, src), self.isend(sendbuf, dst)])


# -- running the student's code beside the reference -------------------------------------------


@dataclass
class Session:
    pairs: list = field(default_factory=list)  # (reference Recorder, student Recorder, phases)
    describe: object = None  # value -> words, for inputs that tell whose data they hold


@contextlib.contextmanager
def explaining():
    """Inside the block, graded algorithms also run their reference and are recorded (the open
    sessions are `process.explaining`, minipar.state)."""
    session = Session()
    process.explaining.append(session)
    try:
        yield session
    finally:
        process.explaining.remove(session)


def describe_values(describe) -> None:
    """Tell the open session how to put a value into words (e.g. whose sum it is)."""
    if process.explaining:
        process.explaining[-1].describe = describe


def _is_call(call) -> bool:
    return all(hasattr(call, a) for a in ("rounds", "sendrecv", "comm", "collective"))


def _names(fn, count: int) -> list[str]:
    params = list(inspect.signature(fn).parameters)[1:]
    return [params[i] if i < len(params) else f"arg{i + 1}" for i in range(count)]


def _bases(names, args) -> dict:
    return {n: buffers.flat(a) for n, a in zip(names, args) if _is_buffer(a)}


def graded(fn, reference=None, phases=(), chunks=None):
    """`fn` (an algorithm: fn(call, ...)), recorded beside `reference` inside `explaining()`.
    Elsewhere, or without a reference, it is just fn. `phases` names the reference's
    call.rounds() loops in order ("reduce-scatter", "all-gather"); `chunks(call)` is how many
    chunks the exercise cuts a buffer into when it speaks of "chunk c" (default: the group's
    size, as a ring does)."""

    @functools.wraps(fn)
    def run(call, *args, **kwargs):
        if not process.explaining or reference is None or not _is_call(call):
            return fn(call, *args, **kwargs)
        names = _names(reference, len(args))
        copies = [_copy(a) if _is_buffer(a) else a for a in args]
        parts = chunks(call) if chunks is not None else call.size
        with ledger.paused():  # the ledger sees the student's messages only
            ref = Recorder(
                Call(call.comm, call.collective, call.algorithm), _bases(names, copies), parts
            )
            reference(ref, *copies, **kwargs)
            ref.finish()
        mine = Recorder(call, _bases(names, args), parts)
        mine.reference, mine.phase_names = ref, tuple(phases)
        process.explaining[-1].pairs.append((ref, mine, tuple(phases)))
        try:
            return fn(mine, *args, **kwargs)
        except Exception as error:
            mine.error = stopping.first_line(error)
            raise
        finally:
            mine.finish()

    return run


# -- notes: what each rank saw, small enough to pool ---------------------------------------------


@dataclass
class Side:
    messages: list
    phases: list
    pending: list
    error: str


@dataclass
class Notes:
    rank: int
    reference: Side
    mine: Side
    phase_names: tuple
    parted: tuple | None  # the first (step, name, index, chunk, mine, reference) that differs
    node_of: tuple | None = None  # each group rank's node, when the group spans nodes


def _side(r: Recorder) -> Side:
    return Side(r.messages, r.phases, r.pending, r.error)


def _first_difference(ref: Recorder, mine: Recorder, describe) -> tuple | None:
    """The first step after which an argument differs, and its first differing element."""
    import numpy as np

    for step in sorted(set(ref.snapshots) & set(mine.snapshots)):
        for name, want in ref.snapshots[step].items():
            a, b = _numpy(mine.snapshots[step][name]), _numpy(want)
            differ = np.flatnonzero(~((a == b) | ((a != a) & (b != b))))  # NaN == NaN here
            if len(differ):
                i = int(differ[0])
                edges = layout.bounds(len(b), ref.parts)
                chunk = next(c for c in range(ref.parts) if edges[c] <= i < edges[c + 1])
                if not any(m.where.chunk is not None for m in ref.messages):
                    chunk = None  # the reference moves no chunks: do not speak of them
                words = describe or _plain
                return (step, name, i, chunk, words(a[i].item()), words(b[i].item()))
    return None


def _numpy(x):
    """A numpy array to compare (torch's float16 and bfloat16 as float64)."""
    if not buffers.is_torch(x):
        return x
    x = x.detach().cpu()
    return (x.double() if x.is_floating_point() else x).numpy()


def _plain(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def notes(session: Session) -> list[Notes]:
    """This rank's notes on every graded call of the session, to pool with the other ranks'."""
    return [
        Notes(
            ref.rank,
            _side(ref),
            _side(mine),
            phases,
            _first_difference(ref, mine, session.describe),
            mine.node_of,
        )
        for ref, mine, phases in session.pairs
    ]


def _nodes_of(comm) -> tuple | None:
    """The node of each rank of the group (runtime/nodes.py), or None when it runs on one
    node: the explanation then says on which level a message went wrong."""
    world_map, ranks = process.nodes, getattr(comm, "global_ranks", None)
    if world_map is None or ranks is None:
        return None
    owner = tuple(world_map.of_group(ranks))
    return owner if len(set(owner)) > 1 else None


def _level(n: Notes, step: int) -> str:
    """' (between nodes: node 0 -> node 1)' or ' (inside node 0)' for the first message of
    `step` that differs on this rank, when the group spans nodes; else ''."""
    if n.node_of is None:
        return ""
    ref = [m.key() for m in _at(n.reference.messages, step)]
    odd = [m for m in _at(n.mine.messages, step) if m.key() not in ref]
    odd += [m for m in _at(n.reference.messages, step) if m not in odd]
    if not odd:
        return ""
    a, b = n.node_of[n.rank], n.node_of[odd[0].peer]
    return f" (between nodes: node {a} and node {b})" if a != b else f" (inside node {a})"


# -- the explanation -----------------------------------------------------------------------------


def _label(phases, names, step: int) -> str:
    """'all-gather step 0' for a step of a named phase, else 'step 3'."""
    for i, (first, n) in enumerate(phases):
        if first <= step < first + n:
            if i < len(names):
                return f"{names[i]} step {step - first}"
            return f"phase {i + 1} step {step - first}" if len(phases) > 1 else f"step {step}"
    total = sum(n for _, n in phases)
    if not phases:
        return f"step {step}"
    return f"step {step} (the reference takes {total} step{'s' * (total != 1)})"


def _at(messages, step):
    return sorted((m for m in messages if m.step == step), key=lambda m: (m.kind != "send", m.peer))


def _parted_messages(everyone: list[Notes]) -> tuple[int, Notes] | None:
    """(step, that rank's notes): the first step at which a rank's messages differ from the
    reference's."""
    steps = {m.step for n in everyone for m in n.mine.messages + n.reference.messages}
    for step in sorted(steps):
        for n in everyone:
            mine = [m.key() for m in _at(n.mine.messages, step)]
            if mine != [m.key() for m in _at(n.reference.messages, step)]:
                return step, n
    return None


def _headline(label: str, n: Notes, step: int) -> str:
    mine, ref = _at(n.mine.messages, step), _at(n.reference.messages, step)
    extra = [m for m in mine if m.key() not in [r.key() for r in ref]]
    missing = [r for r in ref if r.key() not in [m.key() for m in mine]]
    for kind in ("send", "recv"):  # pair a wrong send with the right one first
        wrong = [m for m in extra if m.kind == kind]
        right = [m for m in missing if m.kind == kind]
        if wrong and right:
            said = f"{label}: rank {n.rank} {wrong[0].said()}; the reference {right[0].said(True)}"
            return said + _sizes(wrong[0], right[0])
    if extra and missing:
        return f"{label}: rank {n.rank} {extra[0].said()}; the reference {missing[0].said(True)}"
    if extra:
        return f"{label}: rank {n.rank} {extra[0].said()}, which the reference does not (extra)"
    if missing:
        return f"{label}: the reference {missing[0].said(True)}; rank {n.rank} does not (missing)"
    return f"{label}: rank {n.rank} sent the same messages in another order"


def _sizes(mine: Message, ref: Message) -> str:
    """': yours 3 elements, the reference 4 (...)' for a message to or from the reference's
    peer whose size differs from the reference's ('' otherwise)."""
    if mine.peer != ref.peer or mine.nbytes == ref.nbytes:
        return ""
    a, b = (m.where.stop - m.where.start for m in (mine, ref))
    return (
        f": yours {a} element{'s' * (a != 1)}, the reference {b} (a message of the wrong "
        "size: sender and receiver must post the same length)"
    )


def _size_error(n: Notes) -> bool:
    """The rank stopped because a message's size differed from its receive's: its pending
    messages were cut short by that error, not left waiting (no hang)."""
    return n.mine.error.startswith("MessageSizeError")


def _table(header, rows) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = "  ".join
    out = [line(str(h).ljust(w) for h, w in zip(header, widths))]
    out += [line(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return ["  " + text for text in out]


def _message_rows(everyone: list[Notes], step: int) -> list[tuple]:
    rows = []
    for n in everyone:
        mine = [
            m.said() + (_unfinished(n) if m in n.mine.pending else "")
            for m in _at(n.mine.messages, step)
        ]
        ref = [m.said(True) for m in _at(n.reference.messages, step)]
        same = [m.key() for m in _at(n.mine.messages, step)] == [
            m.key() for m in _at(n.reference.messages, step)
        ]
        for i in range(max(len(mine), len(ref), 1)):
            first = i == 0
            rows.append(
                (
                    f"{n.rank}{'' if same else ' *'}" if first else "",
                    mine[i] if i < len(mine) else ("(nothing)" if first else ""),
                    ref[i] if i < len(ref) else ("(nothing)" if first else ""),
                )
            )
    return rows


def _unfinished(n: Notes) -> str:
    return " (stopped: the sizes differ)" if _size_error(n) else " (never completed)"


def _steps_line(everyone: list[Notes]) -> str | None:
    """The steps of each call.rounds() loop, yours beside the reference's, when they differ
    (not when an error stopped yours before its later loops began)."""
    n = everyone[0]
    mine = [k for _, k in n.mine.phases]
    ref = [k for _, k in n.reference.phases]
    if mine == ref or (n.mine.error and mine == ref[: len(mine)]):
        return None

    def named(counts) -> str:
        names = list(n.phase_names) + [f"loop {i + 1}" for i in range(len(counts))]
        return ", ".join(f"{names[i]} {k}" for i, k in enumerate(counts)) or "none"

    return (
        f"steps per call.rounds() loop on rank {n.rank}: yours {named(mine)}; the reference "
        f"{named(ref)}"
    )


def _pending_lines(everyone: list[Notes]) -> list[str]:
    """What was still pending on each rank, and the error of each rank whose own mistake (not a
    wait on another rank) stopped it; a deadlock is named only when no rank failed first."""
    lines = []
    for n in everyone:
        for m in [] if _size_error(n) else n.mine.pending:  # a size error is no hang
            lines.append(f"rank {n.rank}, step {m.step}: was still waiting to finish: {m.said()}")
    causes = [n for n in everyone if n.mine.error and not stopping.followed(n.mine.error)]
    lines += [f"rank {n.rank} stopped with {n.mine.error}" for n in causes]
    if any(n.mine.pending for n in everyone) and not causes:
        lines.append(
            "every rank listed waits for a message its peer never posts (a deadlock) or for one "
            "that went elsewhere: compare the posted calls with the reference's"
        )
    return lines


def explanation(everyone: list[list[Notes]]) -> str | None:
    """The first step where the student's run parts from the reference, as text (a headline and
    a table of that step on every rank), from every rank's notes (`everyone[rank]`); None when
    the messages and every step's buffers matched on every call."""
    calls = min((len(n) for n in everyone), default=0)
    for c in range(calls):
        text = _explain_call([n[c] for n in everyone], c)
        if text:
            return text
    return None


def _explain_call(everyone: list[Notes], c: int) -> str | None:
    parted = _parted_messages(everyone)
    data = [(n.parted, n) for n in everyone if n.parted is not None]
    first_data = min(data, key=lambda d: (d[0][0], d[1].rank), default=None)
    if parted is None and first_data is None:
        return None
    phases, names = everyone[0].reference.phases, everyone[0].phase_names
    ordinal = f" (call {c + 1} of the test)" if c else ""
    if parted is not None and (first_data is None or parted[0] <= first_data[0][0]):
        step, first = parted
        label = _label(phases, names, step)
        lines = [_headline(label, first, step) + _level(first, step)]
        lines.append(f"{label}{ordinal}, every rank's messages (* where they differ):")
        lines += _table(["rank", "yours", "the reference"], _message_rows(everyone, step))
    else:
        (step, name, i, chunk, got, want), n = first_data
        label = "the end" if step == END else _label(phases, names, step)
        lines = [
            f"{'after ' if step != END else 'at '}{label}: every message matched the reference's, "
            f"but rank {n.rank}'s {name}[{i}]{'' if chunk is None else f' (chunk {chunk})'} "
            f"holds {got} where the reference's holds {want}{ordinal}"
        ]
        rows = [
            (d[1].rank, f"{d[0][1]}[{d[0][2]}]", "-" if d[0][3] is None else d[0][3], *d[0][4:])
            for d in data
            if d[0][0] == step
        ]
        lines.append(f"after {label}, the first element that differs on each rank:")
        lines += _table(["rank", "element", "chunk", "yours", "the reference"], rows)
    steps = _steps_line(everyone)
    return "\n".join(lines + ([steps] if steps else []) + _pending_lines(everyone))


# -- a test case that explains its own failure -------------------------------------------------


def explained(case, group, failed=None):
    """`case` (a function run on every rank), wrapped: inside `explaining()`, then every rank pools
    its notes on `group()` (a collective: every rank must run every case). A rank whose case
    fails tells the others at once (course/stopping.py): their waits for it end now, not at
    their timeout. A rank whose case failed raises ExplainedError: first the root cause (the
    first rank whose error was not a consequence of another's: not a timeout, not a wait the
    stop ended), then below SENTINEL the explanation and what followed on the other ranks; or
    the case's own error when there is nothing to add (no graded call and no other rank's
    failure to name, or an exercise not started yet). `failed()`, if given, is called on every
    rank when the case failed on any."""

    @functools.wraps(case)
    def run():
        control = group()
        error = None
        with explaining() as session, stopping.Stopper(control) as stop:
            try:
                case()
            except Exception as e:  # noqa: BLE001 - re-raised below, explained if we can
                error = e
                stop.tell(e)
        flags = control.allgather_object(_flags(error, stop.told), "the grader's flags")
        stop.settle([r for r, f in enumerate(flags) if f[2]])
        if not any(f[0] for f in flags):
            return
        if failed is not None:
            failed()  # on every rank: the case failed somewhere
        if any(f[1] for f in flags):  # nothing to compare yet
            if error is not None:
                raise error
            return
        everyone = control.allgather_object(notes(session), "the grader's notes")
        if error is None:
            return
        text = explanation(everyone) or ""
        root = next((r for r, f in enumerate(flags) if f[0] and not f[3]), None)
        after = _consequences(flags, root)
        if not text and not after:
            raise error
        if root is not None:
            head = flags[root][4]
        else:  # only timeouts: the first place the messages part says more than any of them
            head = text.splitlines()[0] if text else stopping.first_line(error)
        body = "\n".join(t for t in (text, after) if t)
        raise ExplainedError(f"{head}\n{SENTINEL}\n{body}") from error

    return run


def _flags(error, told: bool) -> tuple:
    """(failed, not started, told the others, a consequence, its first line) of this rank."""
    return (
        error is not None,
        isinstance(error, NotImplementedError),
        told,
        stopping.consequence(error),
        stopping.first_line(error) if error is not None else "",
    )


def _consequences(flags, root) -> str:
    """'rank 1 failed first; then rank 0: MismatchError: stopped waiting ...' for the ranks
    whose error followed another's (a timeout, a wait the stop ended); '' when none did."""
    after = [(r, f[4]) for r, f in enumerate(flags) if f[0] and f[3] and r != root]
    if not after:
        return ""
    first = f"rank {root} failed first" if root is not None else "no rank failed first"
    lines = [f"{first}; what followed on the other ranks (consequences, not causes):"]
    lines += [f"  rank {r}: {line}" for r, line in after]
    return "\n".join(lines)
