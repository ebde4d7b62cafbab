"""A collective call's signature: what every rank of the group must agree on, and its tag bits.

A signature is a plain tuple, built on every call from the arguments every rank passes alike:

    (collective, algorithm, dtype, nbytes, op, root_name, root)
    ("broadcast", "tree", dtype('float32'), 32, None, "src", 0)

with the dtype and op objects as the caller has them and the byte count the collective moves
(api.py already has it), because naming them costs more than the rest of the call's bookkeeping:
`normal` turns it into names and the caller's element count, (..., "float32", 8, ...), only
when a signature is first hashed, sent to a peer or shown.

`tag_hash` folds it into a few bits of the call's tag (see base.TagLayout), chained with the
group's earlier calls, so two ranks that disagree on any field post messages under different
tags: the messages no longer match, and the watchdog (comm/guards/watchdog.py) sees a peer's message
under a foreign tag, or a rank that waits too long asks (guards/stall.py), and both calls are named.
`first_difference` finds the call where two ranks' recent calls part; `mismatch_text`,
`groups_text`, `history_text` and `missing_text` render the errors.
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
        if group_size and count is not None:
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
        parts.append(dtype if count is None else f"{dtype} x {count}")  # None: sizes may differ
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


RULE = "every rank must make the same calls in the same order with matching arguments"


def mismatch_text(group: str, seq: int, rank_a: int, sig_a, rank_b: int, sig_b) -> str:
    """The MismatchError message: both calls (normal() signatures), and what differs."""
    fields = differing(sig_a, sig_b)
    show_algorithm = "algorithm" in fields  # "auto" chose differently: worth saying
    if rank_a > rank_b:
        rank_a, sig_a, rank_b, sig_b = rank_b, sig_b, rank_a, sig_a
    return (
        f"rank {rank_a} called {render(sig_a, show_algorithm)} on group {group} but rank "
        f"{rank_b} called {render(sig_b, show_algorithm)} (call #{seq} on group {group}; they "
        f"differ in {', '.join(fields) or 'nothing visible'}); {RULE}"
    )


def groups_text(a, b) -> str:
    """Two ranks stuck in calls on different groups, each waiting on a group whose call the other
    never reaches: a = (world rank, group name, seq, normal signature), b the same."""
    if a[0] > b[0]:
        a, b = b, a
    fields = ["group", *differing(a[3], b[3])]
    show_algorithm = "algorithm" in fields
    return (
        f"rank {a[0]} called {render(a[3], show_algorithm)} on group {a[1]} but rank {b[0]} "
        f"called {render(b[3], show_algorithm)} on group {b[1]} (call #{a[2]} on group {a[1]}, "
        f"call #{b[2]} on group {b[1]}; they differ in {', '.join(fields)}); {RULE}, on the "
        "same groups"
    )


def history_text(group: str, seq: int, rank_a: int, rank_b: int) -> str:
    """Two ranks whose histories of calls on a group differ before the calls they still hold."""
    rank_a, rank_b = sorted((rank_a, rank_b))
    return (
        f"rank {rank_a} and rank {rank_b} disagree about a call on group {group} before call "
        f"#{seq} (their chained signatures differ; the call itself is older than the ones each "
        f"rank keeps at hand); {RULE}"
    )


def missing_text(group: str, seq: int, rank_a: int, sig_a, rank_b: int, why: str) -> str:
    """A rank that made call #seq while another never will (`why`: 'is leaving the job', ...)."""
    return (
        f"rank {rank_a} called {render(sig_a, False)} on group {group} (call #{seq}) but rank "
        f"{rank_b} {why} without making it; {RULE}"
    )


def first_difference(mine, theirs):
    """Where two ranks' recent calls on a group part (Communicator.recent_calls: (seq, normal
    signature, history) each): None if they agree on the last call both hold; else (seq, my
    signature, their signature) of the first call that differs, or (seq, None, None) when every
    call both hold matches but the histories already differ at the first of them."""
    theirs = {seq: (sig, history) for seq, sig, history in theirs}
    common = [(seq, sig, history) for seq, sig, history in mine if seq in theirs]
    if not common or common[-1][2] == theirs[common[-1][0]][1]:
        return None
    for seq, sig, _ in common:
        if sig != theirs[seq][0]:
            return seq, sig, theirs[seq][0]
    return common[0][0], None, None


def difference_text(group: str, found, rank_a: int, rank_b: int) -> str:
    """The message for first_difference's answer between rank_a (mine) and rank_b (theirs)."""
    seq, sig_a, sig_b = found
    if sig_a is None:
        return history_text(group, seq, rank_a, rank_b)
    return mismatch_text(group, seq, rank_a, sig_a, rank_b, sig_b)
