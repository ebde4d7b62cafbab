"""Object collectives (torch.distributed's names): any picklable Python object, not only tensors.

    minipar.all_gather_object(out, {"loss": 0.5})    # out: a list of group-size entries
    minipar.broadcast_object_list(objs, src=0)        # objs replaced in place on every rank
    minipar.gather_object(obj, out_or_None, dst=0)
    minipar.scatter_object_list(out_list, in_list_or_None, src=0)   # out_list[0] = my object

Each pickles the objects into uint8 buffers and runs two of minipar's own tensor collectives
(so the trace ledger and `algorithm="auto"` see them like any other call): first the sizes
(8 bytes per object), then the bytes, each buffer padded to the largest one where the tensor
collective needs equal blocks (all-gather, gather, scatter). Use them for small control data
(a config, a metric, a vocabulary): pickling costs CPU time, and unpickling runs code, so only
exchange objects you trust.

An object that does not pickle raises TypeError naming its type and the rank holding it on
*every* rank of the group: the sizes step carries a "failed" mark, and the error's text takes
the place of the bytes, so no rank is left waiting.

Ranks follow torch.distributed, like point-to-point (p2p.py): `src` / `dst` are global ranks,
`group_src` / `group_dst` ranks in the group; the default is global rank 0.
"""

from __future__ import annotations

import pickle

import numpy as np

from minipar import runtime
from minipar.collectives import api
from minipar.collectives.p2p import group_rank_of


def _dump(obj, what: str):
    """(pickled bytes, None), or (b"", the reason `obj` does not pickle)."""
    try:
        return pickle.dumps(obj), None
    except Exception as error:  # noqa: BLE001  (pickle raises many kinds; all mean "cannot")
        kind = type(obj)
        return b"", (
            f"{what} of type {kind.__module__}.{kind.__qualname__} cannot be pickled "
            f"({type(error).__name__}: {error})"
        )


def _array(data: bytes):
    return np.frombuffer(bytearray(data), dtype=np.uint8)


def _padded(data, n: int):
    out = np.zeros(n, dtype=np.uint8)
    out[: len(data)] = _array(data) if isinstance(data, bytes) else data
    return out


def _fail(collective: str, reasons) -> None:
    raise TypeError(f"{collective}: " + "; ".join(reasons))


def _check_list(x, what: str, size: int | None = None) -> None:
    if not isinstance(x, list) or (size is not None and len(x) != size):
        got = f"a list of {len(x)}" if isinstance(x, list) else type(x).__name__
        want = f"a list of {size} entries (the group size)" if size else "a list"
        raise ValueError(f"{what} must be {want}, got {got}")


def _sizes_everywhere(comm, data: bytes, error):
    """All-gather one int64 per rank: the pickle's length, or minus the error text's length.
    Returns (sizes, this rank's payload: the pickle or the error text)."""
    payload = error.encode() if error else data
    head = np.array([-len(payload) if error else len(payload)], dtype=np.int64)
    sizes = np.empty(comm.size, dtype=np.int64)
    api.all_gather_into_tensor(sizes, head, group=comm)
    return sizes, payload


def _all_gather_bytes(comm, sizes, payload):
    """Every rank's payload, padded to the longest: p * max bytes in, blocks trimmed back."""
    n = int(np.abs(sizes).max())
    out = np.empty(comm.size * n, dtype=np.uint8)
    api.all_gather_into_tensor(out, _padded(payload, n), group=comm)
    return [out[q * n : q * n + abs(int(sizes[q]))].tobytes() for q in range(comm.size)]


def _raise_gathered(collective: str, comm, sizes, payload) -> None:
    """If any rank's object failed to pickle, every rank learns why and raises the same."""
    if (sizes < 0).any():
        blocks = _all_gather_bytes(comm, sizes, payload)
        _fail(collective, [blocks[q].decode() for q in range(comm.size) if sizes[q] < 0])


def all_gather_object(object_list, obj, group=None) -> None:
    """Every rank's `obj` into object_list[rank] on every rank.

    Moves: an all-gather of p int64 sizes, then an all-gather of p * m bytes (m the largest
    pickle); steps: those of the two all-gathers (algorithm "auto")."""
    if group is not None and runtime.outside(group, "all_gather_object"):
        return None
    comm = runtime.resolve(group)
    _check_list(object_list, "object_list", comm.size)
    data, error = _dump(obj, f"the object of rank {comm.global_ranks[comm.rank]}")
    sizes, payload = _sizes_everywhere(comm, data, error)
    _raise_gathered("all_gather_object", comm, sizes, payload)
    for q, block in enumerate(_all_gather_bytes(comm, sizes, payload)):
        object_list[q] = pickle.loads(block)


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None) -> None:
    """Every rank's `obj` into object_gather_list[rank] on rank `dst` (global; or `group_dst`).

    Moves: an all-gather of p int64 sizes (so every rank knows whether all objects pickled),
    then a gather of m bytes from each rank to dst (m the largest pickle)."""
    if group is not None and runtime.outside(group, "gather_object"):
        return None
    comm = runtime.resolve(group)
    root = group_rank_of(comm, dst, group_dst, "dst", default=0)
    if comm.rank == root:
        _check_list(object_gather_list, "object_gather_list", comm.size)
    data, error = _dump(obj, f"the object of rank {comm.global_ranks[comm.rank]}")
    sizes, payload = _sizes_everywhere(comm, data, error)
    _raise_gathered("gather_object", comm, sizes, payload)
    n = int(sizes.max())
    blocks = [np.empty(n, dtype=np.uint8) for _ in range(comm.size)] if comm.rank == root else None
    api.gather(_padded(payload, n), blocks, dst=root, group=comm)
    if comm.rank == root:
        for q, block in enumerate(blocks):
            object_gather_list[q] = pickle.loads(block[: int(sizes[q])].tobytes())


def _broadcast_failure(collective: str, comm, head, root: int, error) -> None:
    """head[0] < 0 marks a failure on the root: broadcast the reason, raise it everywhere."""
    if head[0] < 0:
        text = _array(error.encode()) if comm.rank == root else np.empty(-head[0], np.uint8)
        api.broadcast(text, root, group=comm)
        _fail(collective, [text.tobytes().decode()])


def _dump_all(objects, what: str):
    """(pickles, None) or ([], the reasons of every object that does not pickle)."""
    dumped = [_dump(o, f"{what}[{i}]") for i, o in enumerate(objects)]
    reasons = [error for _, error in dumped if error]
    return ([d for d, _ in dumped], None) if not reasons else ([], "; ".join(reasons))


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Rank `src`'s objects replace object_list's entries on every rank (same length everywhere).

    Moves: a broadcast of k + 1 int64 (k = len(object_list): a status and the k sizes), then a
    broadcast of the pickles' total bytes. `device` is accepted for torch's signature and
    ignored: the bytes cross on the host."""
    del device
    if group is not None and runtime.outside(group, "broadcast_object_list"):
        return None
    comm = runtime.resolve(group)
    root = group_rank_of(comm, src, group_src, "src", default=0)
    _check_list(object_list, "object_list")
    k, error, data = len(object_list), None, []
    head = np.zeros(k + 1, dtype=np.int64)
    if comm.rank == root:
        data, error = _dump_all(object_list, "object_list")
        head[0] = -len(error.encode()) if error else 0
        head[1:] = [len(d) for d in data] if data else 0
    api.broadcast(head, root, group=comm)
    _broadcast_failure("broadcast_object_list", comm, head, root, error)
    payload = _array(b"".join(data)) if comm.rank == root else np.empty(head[1:].sum(), np.uint8)
    api.broadcast(payload, root, group=comm)
    if comm.rank != root:
        edges = np.concatenate([[0], np.cumsum(head[1:])])
        for i in range(k):
            object_list[i] = pickle.loads(payload[edges[i] : edges[i + 1]].tobytes())


def scatter_object_list(
    scatter_object_output_list,
    scatter_object_input_list=None,
    src=None,
    group=None,
    group_src=None,
):
    """Rank `src` sends scatter_object_input_list[r] to rank r, which stores it in
    scatter_object_output_list[0].

    Moves: a broadcast of p + 1 int64 (a status and the p sizes), then a scatter of m bytes to
    each rank (m the largest pickle)."""
    if group is not None and runtime.outside(group, "scatter_object_list"):
        return None
    comm = runtime.resolve(group)
    root = group_rank_of(comm, src, group_src, "src", default=0)
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError(
            "scatter_object_output_list must be a list of at least one entry (entry 0 receives "
            f"the object), got {scatter_object_output_list!r}"[:200]
        )
    head, error, data = np.zeros(comm.size + 1, dtype=np.int64), None, []
    if comm.rank == root:
        _check_list(scatter_object_input_list, "scatter_object_input_list", comm.size)
        data, error = _dump_all(scatter_object_input_list, "scatter_object_input_list")
        head[0] = -len(error.encode()) if error else 0
        head[1:] = [len(d) for d in data] if data else 0
    api.broadcast(head, root, group=comm)
    _broadcast_failure("scatter_object_list", comm, head, root, error)
    n = int(head[1:].max())
    pieces = [_padded(d, n) for d in data] if comm.rank == root else None
    mine = np.empty(n, dtype=np.uint8)
    api.scatter(mine, pieces, src=root, group=comm)
    scatter_object_output_list[0] = pickle.loads(mine[: int(head[1 + comm.rank])].tobytes())
