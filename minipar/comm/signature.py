"""A collective call's signature: what every rank of the group must agree on, and its tag bits.

A signature is a plain tuple, built on every call from the arguments every rank passes alike:

    (collective, algorithm, dtype, nbytes, op, root_name, root)
    ("broadcast", "tree", dtype('float32'), 32, None, "src", 0)

with the dtype and op objects as the caller has them and the byte count the collective moves
(api.py already has it), because naming them costs more than the rest of the call's bookkeeping:
`normal` turns it into names and the caller's element count, (..., "float32", 8, ...), only
when a signature is first hashed, sent to a peer or shown.

`tag_hash` folds it into a few bits of the call's tag (see base.TagLayout), so two ranks that
disagree on any field post messages under different tags: the messages no longer match, and the
watchdog (comm/watchdog.py) sees a peer's message under a foreign tag and names both calls.
`mismatch_text` renders the error.
"""

from __future__ import annotations

import zlib

FIELDS = ("collective", "algorithm", "dtype", "count", "op", "root_name", "root")
PER_RANK = ("all_gather", "scatter", "gather")  # nbytes counts every rank's block: / group size

_HASHES: dict = {}  # signature -> hash: a training loop repeats the same few calls


def tag_hash(sig) -> int:
    """A 32-bit hash of the signature, the same on every rank and in every run (crc32 of its text:
    Python's own hash of a str differs from process to process). Computed once per distinct
    signature; afterwards a call pays one dict lookup (base.Communicator.next_collective_tag)."""
    h = _HASHES.get(sig)
    if h is None:
        if len(_HASHES) > 4096:  # sizes that change every call: keep the cache bounded
            _HASHES.clear()
        h = _HASHES[sig] = zlib.crc32("|".join(map(str, normal(sig))).encode())
    return h


def normal(sig, group_size: int = 1) -> tuple:
    """The signature in plain, comparable, picklable values: the dtype's name (numpy and torch
    spell float32 alike), the op's name, and the element count of the caller's tensor (with
    group_size = 1, the byte count: what the hash covers, the same on every rank)."""
    collective, algorithm, dtype, count, op, root_name, root = sig
    if dtype is not None and not isinstance(dtype, str):
        if group_size:
            per_rank = group_size if collective in PER_RANK else 1
            count = count // max(1, dtype.itemsize * per_rank)
        dtype = str(dtype).removeprefix("torch.")
    if op is not None:
        op = str(getattr(op, "name", op)).upper()
    return (collective, algorithm, dtype, count, op, root_name, root)


def render(sig, algorithm: bool = True) -> str:
    """broadcast(src=0, float32 x 8), from a normal() signature: the call as a user wrote it."""
    collective, alg, dtype, count, op, root_name, root = sig
    parts = []
    if root_name is not None:
        parts.append(f"{root_name}={root}")
    if op is not None:
        parts.append(f"op={op}")
    if dtype is not None:
        parts.append(f"{dtype} x {count}")
    if algorithm:
        parts.append(f"algorithm={alg}")
    return f"{collective}({', '.join(parts)})"


def differing(a, b) -> list[str]:
    """The names of the fields where two signatures differ ('src' for a root, 'op', ...)."""
    out = []
    for name, x, y in zip(FIELDS, a, b):
        if x != y and name != "root_name":
            out.append((a[5] or b[5] or "root") if name == "root" else name)
    return out


def mismatch_text(group: str, seq: int, rank_a: int, sig_a, rank_b: int, sig_b) -> str:
    """The MismatchError message: both calls (normal() signatures), and what differs."""
    fields = differing(sig_a, sig_b)
    show_algorithm = "algorithm" in fields  # "auto" chose differently: worth saying
    if rank_a > rank_b:
        rank_a, sig_a, rank_b, sig_b = rank_b, sig_b, rank_a, sig_a
    return (
        f"rank {rank_a} called {render(sig_a, show_algorithm)} but rank {rank_b} called "
        f"{render(sig_b, show_algorithm)} (call #{seq} on group {group}; they differ in "
        f"{', '.join(fields) or 'nothing visible'}); every rank must make the same calls in the "
        "same order with matching arguments"
    )
