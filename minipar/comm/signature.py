"""A collective call's signature: what every rank of the group must agree on, and its tag bits.

A signature is a plain tuple, built once per call from the arguments every rank passes alike:

    (collective, algorithm, dtype, count, op, root_name, root)
    ("broadcast", "tree", dtype('float32'), 8, None, "src", 0)

(the dtype object and the op's value as the caller has them: turning them into names costs more
than the whole hash, so `normal` does that only when a signature is hashed the first time, sent or
shown).

`tag_hash` folds it into a few bits of the call's tag (see base.TagLayout), so two ranks that
disagree on any field post messages under different tags: the messages no longer match, and the
watchdog (comm/watchdog.py) sees a peer's message under a foreign tag and names both calls.
`mismatch_text` renders the error. Only the tag hash is on every call's path: keep it cheap.
"""

from __future__ import annotations

import zlib

FIELDS = ("collective", "algorithm", "dtype", "count", "op", "root_name", "root")

_HASHES: dict = {}  # signature -> hash: a training loop repeats the same few calls


def tag_hash(sig) -> int:
    """A 32-bit hash of the signature, the same on every rank and in every run (crc32 of its text:
    Python's own hash of a str differs from process to process). Computed once per distinct
    signature; afterwards a call pays one dict lookup (the tuple's hash, in C)."""
    h = _HASHES.get(sig)
    if h is None:
        if len(_HASHES) > 4096:  # counts that change every call: keep the cache bounded
            _HASHES.clear()
        h = _HASHES[sig] = zlib.crc32("|".join(map(str, normal(sig))).encode())
    return h


def normal(sig) -> tuple:
    """The signature as plain, comparable, picklable values: the dtype as its name (numpy and
    torch spell float32 alike), the op as its name."""
    collective, algorithm, dtype, count, op, root_name, root = sig
    if dtype is not None and not isinstance(dtype, str):
        dtype = str(dtype).removeprefix("torch.")
    if op is not None:
        op = str(getattr(op, "name", op)).upper()
    return (collective, algorithm, dtype, count, op, root_name, root)


def render(sig, algorithm: bool = True) -> str:
    """broadcast(src=0, float32 x 8) — the way a user wrote the call, roughly."""
    collective, alg, dtype, count, op, root_name, root = normal(sig)
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
    """The MismatchError message: both calls, side by side, and what differs."""
    sig_a, sig_b = normal(sig_a), normal(sig_b)
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
