"""Fast path: which transport carries a collective call, MPI messages (the reference) or windows.

Inside one node the single-copy windows of comm/transport/shm.py move a byte with one copy where an
MPI message takes two. Only the bandwidth algorithms of the collectives that move the most bytes
take them (the ring's all-reduce, all-gather and reduce-scatter: the windows reduce each element
in the ring's order, so the results are the same bits either way), and `auto`
(also what `algorithm="auto"` resolves to) does so when every rank of the group shares this
node, the buffer is in host memory, and the cost model prices the window's link below the
algorithm over MPI (minipar.cost.prefers_shm: only with a fitted window link, MINIPAR_SHM_LINK
from `minipar bench --fit`; never below cost.SHM_MIN_BYTES).

Overrides, the same on every rank:
- the environment: MINIPAR_TRANSPORT=mpi (never shared windows), shm (every built-in
  algorithm of those collectives, at any size, whenever the group can share memory) or auto
  (the default);
- one call: `algorithm="ring@shm"` or `"ring@mpi"` (any algorithm name, then @transport).

The trace shows the choice: a call that went through the windows is recorded with algorithm
"<name>@shm", and its messages (what each peer read) with path "shm".

A ring all-reduce that stays on MPI (no window link, a numpy buffer, no trace open) and whose
chunks span more than one piece runs as pieces.py: the same messages cut in pieces, the same
bits; one whose chunks fit in cache runs as scratch_sums.py: the same messages, its partial sums
kept in scratch, the same bits. Both are minipar's own ring only: the student edition runs the
student's (`ring_is_minipars`).

A buffer that lives in a window already (`minipar.empty`, DDP's buckets, FSDP's flat vectors:
comm/transport/shm_buffers.py) is reduced where it lies, with no copy in (in_place.py; path
"shm-in-place"): `window_of` finds it, from the buffer alone and with the fast paths on or off,
and for it `auto` means the ring (collectives/api.py), so the switch changes no bits.
"""

from __future__ import annotations

import os

import numpy as np

from minipar import cost
from minipar.collectives import registry
from minipar.collectives.fast import in_place, pieces, scratch_sums, windows
from minipar.collectives.registry import split
from minipar.comm.transport import buffers, shm, shm_buffers
from minipar.state import process

ENV = "MINIPAR_TRANSPORT"
CHOICES = ("auto", "mpi", "shm")
ROUTED = {  # the windows reduce in the ring's order (windows.py): the ring alone is routed
    "all_reduce": ("ring",),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
}


WINDOW_ARG = {"all_reduce": 0, "all_gather": 0, "reduce_scatter": 1}  # the buffer read in place


def window_of(comm, collective: str, nbytes: int, args):
    """(window, byte offset) of this call's buffer (all-reduce: x, all-gather: the output,
    reduce-scatter: the input) when it lives in a window of the group's node and can be
    reduced there in place; else None (the common case costs two attribute reads). Messages
    of at most cost.SHM_MIN_BYTES are left to the plain path (the lean path's regime)."""
    node = getattr(comm, "_shm_node", None)
    at = WINDOW_ARG.get(collective)
    if not node or not node.buffers or at is None or nbytes <= cost.SHM_MIN_BYTES:
        return None
    buf = args[at]
    if buffers.is_cuda(buf):
        return None
    place = shm_buffers.find(node, buf)
    if place is None or place[1] % buffers.itemsize(buf):
        return None
    if collective != "all_reduce":  # the other buffer may only overlap it as my own block
        small = args[1 - at]
        block = shm_buffers.address(buf) + comm.rank * buffers.nbytes(small)
        if buffers.overlaps(small, buf) and shm_buffers.address(small) != block:
            return None
    return place


def bench_variants(collective: str) -> list[str]:
    """Extra `minipar bench` rows: the ring forced onto each transport, side by side."""
    return ["ring@mpi", "ring@shm"] if collective in ROUTED else []


def _env():
    """MINIPAR_TRANSPORT as set now (tests and users may change it between calls)."""
    value = env_raw()
    return None if value is None or isinstance(value, str) else os.fsdecode(value)


def env_raw():
    """The same, undecoded, read from os.environ's own dict: `os.environ.get` of a missing name
    raises and catches a KeyError inside (~1-10 us), which every collective call would pay."""
    data = getattr(os.environ, "_data", None)
    if data is None:  # pragma: no cover - not CPython's os._Environ
        return os.environ.get(ENV)
    return data.get(_ENV_KEY)


_ENV_KEY = os.fsencode(ENV) if os.name != "nt" else ENV.upper()
AUTO_RAW = (None, b"auto", "auto")  # env_raw() values that mean "auto"


def requested() -> str:
    """MINIPAR_TRANSPORT, checked (a typo is an error, not silently MPI)."""
    value = (_env() or "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV} must be one of {', '.join(CHOICES)}, got {value!r}")
    return value


def route(comm, collective: str, name: str, fn, nbytes: int, buf, place=None):
    """(name, function) that run this call: fn over the group's transport, or the single-copy
    schedule over shared windows. Decided from what every rank shares (the collective, the
    algorithm, the size, the environment; `place`, window_of's answer, is the same on every rank
    when every rank passes its twin of a window buffer), so all ranks decide alike; the first
    call that may use the windows probes the node, collectively. With the fast paths off
    (minipar.state's `process.fast_paths`) only an explicit request takes them: "ring@shm",
    MINIPAR_TRANSPORT=shm."""
    raw = env_raw()
    if place is not None:
        found = _in_place(comm, collective, name, place)
        if found is not None:
            return found
    if (
        type(name) is str
        and name in registry.BUILTIN.get(collective, ())
        and raw in AUTO_RAW
        and (
            not process.fast_paths
            or not (name in ROUTED.get(collective, ()) and nbytes >= cost.SHM_MIN_BYTES)
        )
    ):
        return name, fn  # the common case, decided in a few lookups: MPI, as always
    if raw in AUTO_RAW and name == "ring" and not _shm_link_named():
        return _pieced(comm, collective, name, fn, nbytes, buf)  # no window link: MPI's ring
    node = _node_for(comm, collective, name, nbytes, buf)
    if node is None:
        return _pieced(comm, collective, name, fn, nbytes, buf)
    base = split(name)[0]
    ticket, schedule = node.ticket(), windows.SCHEDULES[collective]

    def run(call, *args):
        node.run(ticket, call.context(), lambda: schedule(node, call, *args))

    run.__name__ = f"{base}@shm"
    return f"{base}@shm", run


def _shm_link_named() -> bool:
    """Whether MINIPAR_SHM_LINK names a window link (cost.prefers_shm needs one to pick the
    windows), read from os.environ's own dict as env_raw: a missing name costs no KeyError."""
    data = getattr(os.environ, "_data", None)
    if data is None:  # pragma: no cover - not CPython's os._Environ
        return bool(os.environ.get(cost.SHM_LINK_ENV))
    return bool(data.get(_SHM_LINK_KEY))


_SHM_LINK_KEY = os.fsencode(cost.SHM_LINK_ENV) if os.name != "nt" else cost.SHM_LINK_ENV.upper()


def _pieced(comm, collective: str, name, fn, nbytes: int, buf):
    """(name, function) of a ring all-reduce over MPI where it keeps the bits and wins (a numpy
    buffer, MPI, no trace, minipar's own ring): pieces.py's when its chunks span pieces,
    scratch_sums.py's when they fit in cache, else fn."""
    if (
        collective == "all_reduce"
        and name == "ring"
        and process.fast_paths
        and not process.traces
        and type(buf) is np.ndarray
        and comm.backend == "mpi"
        and pieces.ring_is_minipars()
    ):
        if pieces.worth_it(nbytes, comm.size):
            return name, pieces.all_reduce_ring_pieces
        if scratch_sums.worth_it(nbytes, comm.size):
            return name, scratch_sums.all_reduce_ring_scratch
    return name, fn


def _in_place(comm, collective: str, name, place):
    """(name, function) of the in-place schedule (in_place.py) for a buffer at `place`, or None
    to route the call as any other: MINIPAR_TRANSPORT=mpi or "@mpi" keep it on MPI; with the
    fast paths off only an explicit request takes the windows; `auto` takes the ring there."""
    if not isinstance(name, str) or not _in_place_name(collective, name):
        return None  # (a user's own function runs as written)
    base = split(name)[0]
    node, schedule = comm._shm_node, in_place.SCHEDULES[collective]
    ticket = node.ticket()

    def run(call, *args):
        node.run(ticket, call.context(), lambda: schedule(node, call, *args, place))

    run.__name__ = f"{base}@shm"
    return f"{base}@shm", run


def choice(comm, collective: str, name: str, nbytes: int, buf, place=None) -> str:
    """The name `route` would give this call (for the bench's "auto → ..." column)."""
    if place is not None and isinstance(name, str) and _in_place_name(collective, name):
        return f"{split(name)[0]}@shm"
    return f"{split(name)[0]}@shm" if _node_for(comm, collective, name, nbytes, buf) else name


def _in_place_name(collective: str, name: str) -> bool:
    """Whether a call named `name` on a window buffer takes the in-place schedule."""
    base, forced = split(name)
    mode = forced or requested()
    if mode == "mpi" or (mode == "auto" and not process.fast_paths):
        return False
    return base in (ROUTED[collective] if mode == "auto" else registry.BUILTIN[collective])


def _node_for(comm, collective, name, nbytes, buf):
    """The SharedNode this call should run on, or None for the group's own transport."""
    if not isinstance(name, str) or comm.size == 1:
        return None  # one rank: nothing moves, any schedule is the identity
    base, forced = split(name)
    mode = forced or requested()
    if mode == "mpi" or (mode == "auto" and base not in ROUTED.get(collective, ())):
        return None
    if mode == "auto" and not process.fast_paths:
        return None  # the switch is off: only an explicit request takes the windows
    if mode == "shm" and not forced and base not in registry.BUILTIN.get(collective, ()):
        return None  # a user's own algorithm runs as written
    if collective not in windows.SCHEDULES or buf is None or buffers.is_cuda(buf):
        if forced:
            what = f"{collective} of {buffers.describe(buf)}" if buf is not None else collective
            raise ValueError(
                f"{name!r}: the shared-memory transport carries {', '.join(ROUTED)} "
                f"of host buffers only, not {what}"
            )
        return None
    if mode == "auto" and not cost.prefers_shm(collective, base, nbytes, comm.size):
        return None
    node = shm.node_of(comm, f"{collective} (algorithm {name}) on group {comm.name}")
    if node is None and forced:
        raise ValueError(
            f"{name!r}: group {comm.name} cannot share memory (its ranks span nodes, or its "
            "transport is not MPI)"
        )
    return node


def describe(comm) -> str:
    """The transport line of the bench header and `minipar doctor` (collective: it may probe)."""
    try:
        mode = requested()
    except ValueError as error:
        return str(error)
    if mode == "mpi" or getattr(comm, "backend", None) != "mpi":
        return f"{comm.backend} messages only ({ENV}={mode})"
    if shm.node_of(comm) is None:
        return f"mpi only: the group cannot share memory ({ENV}={mode})"
    return f"shm + mpi ({ENV}={mode}): single-copy windows across the {comm.size} ranks"
