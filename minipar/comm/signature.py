"""A collective call's signature: what every rank of the group must agree on, and its tag bits.

A signature is a plain tuple, built once per call from the arguments every rank passes alike:

    (collective, algorithm, dtype, count, op, root_name, root)
    ("broadcast", "tree", "float32", 8, None, "src", 0)

`tag_hash` folds it into a few bits of the call's tag (see base.TagLayout), so two ranks that
disagree on any field post messages under different tags: the messages no longer match, and the
watchdog (comm/watchdog.py) sees a peer's message under a foreign tag and names both calls.
`mismatch_text` renders the error. Only the tag hash is on every call's path: keep it cheap.
"""

from __future__ import annotations

import functools
import zlib

FIELDS = ("collective", "algorithm", "dtype", "count", "op", "root_name", "root")


@functools.cache
def _names_code(collective, algorithm, dtype, op, root_name) -> int:
    """A stable number for the string fields (Python's str hash differs from rank to rank)."""
    return zlib.crc32(f"{collective}|{algorithm}|{dtype}|{op}|{root_name}".encode())


def tag_hash(sig) -> int:
    """A deterministic 64-bit-ish hash of the signature (the same on every rank and run).

    Strings go through crc32 once (cached); the integers join through the tuple hash, which for
    ints is the same in every process (no hash randomisation, unlike str and None), given one
    Python version on every rank.
    """
    collective, algorithm, dtype, count, op, root_name, root = sig
    code = _names_code(collective, algorithm, dtype, op, root_name)
    if count is None:  # hash(None) is its address, which differs from rank to rank
        return code
    return hash((code, count, -1 if root is None else root))


def render(sig, algorithm: bool = True) -> str:
    """broadcast(src=0, float32 x 8) — the way a user wrote the call, roughly."""
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
            out.append(a[5] if name == "root" and a[5] else name)
    return out


def mismatch_text(group: str, seq: int, rank_a: int, sig_a, rank_b: int, sig_b) -> str:
    """The MismatchError message: both calls, side by side, and what differs."""
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
