"""The public collectives, with torch.distributed's names and arguments plus `algorithm=`.

Each function checks its arguments on the calling rank before any byte moves (so a bad root, op
or output size raises the same error on every rank that passed it), picks the algorithm, and
runs it now or, with `async_op=True`, on the progress thread (see work.py).

Differences from torch.distributed, on purpose:
- `src` / `dst` are ranks *in the group* (torch's `group_src` / `group_dst`); on the default
  group that is the same number.
- numpy arrays are accepted wherever tensors are.
- `algorithm=` sits before `async_op` in the positional order: pass async_op by keyword.
The README's API section lists every difference (point-to-point and object collectives, in
p2p.py and objects.py, take torch's global `src` / `dst`).
"""

from __future__ import annotations

import pickle

import numpy as np

from minipar import runtime
from minipar.collectives import fast, registry, work
from minipar.collectives.call import Call
from minipar.collectives.reduce_op import ReduceOp, as_op, check_op, finish_
from minipar.comm.trace import ledger
from minipar.comm.transport import buffers
from minipar.comm.transport.base import CONTROL_TAG, wait_all
from minipar.errors import MiniparError, MismatchError
from minipar.state import process

algorithms = registry.algorithms
register_algorithm = registry.register_algorithm


def _root(root, comm, what: str, group_root=None, default=None) -> int:
    """The root's rank in the group: `root` (minipar's convention: already a group rank) or
    torch's `group_<what>` keyword, not both; `default` when neither is given."""
    if group_root is not None:
        if root is not None:
            raise ValueError(
                f"pass {what} or group_{what}, not both (both are ranks in the group here): "
                f"got {what}={root!r}, group_{what}={group_root!r}"
            )
        root, what = group_root, f"group_{what}"
    elif root is None and default is not None:
        root = default
    if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < comm.size:
        raise ValueError(
            f"{what}={root!r} is not a rank of group {comm.name} (world size {comm.size}; "
            f"valid: 0..{comm.size - 1})"
        )
    return root


def same_type(out, inp, out_what: str, in_what: str) -> None:
    if not buffers.same_kind(out, inp) or buffers.dtype_name(out) != buffers.dtype_name(inp):
        raise ValueError(
            f"{out_what} is {buffers.describe(out)} but {in_what} is {buffers.describe(inp)}; "
            "they must have the same type, dtype and device"
        )


def _matching(out, inp, out_what: str, in_what: str, ratio: int = 1, inverse: bool = False):
    """Check out has the same kind and dtype as inp and numel(out) == ratio * numel(inp)."""
    same_type(out, inp, out_what, in_what)
    a, b = buffers.numel(out), buffers.numel(inp)
    want = b // ratio if inverse else b * ratio
    if a != want or (inverse and b % ratio):
        rule = f"numel({in_what}) / {ratio}" if inverse else f"{ratio} x numel({in_what})"
        size = f" (group size {ratio})" if ratio != 1 else ""
        raise ValueError(
            f"{out_what} has {a} elements but must have "
            f"{rule if ratio != 1 else f'numel({in_what})'} = "
            f"{b / ratio if inverse else want:g}{size}"
        )


def run_call(
    comm,
    collective: str,
    algorithm,
    nbytes: int,
    args,
    async_op: bool,
    finish=None,
    fingerprint=(),
    uneven: bool = False,
):
    """Pick the algorithm, create the Call (its tag) now, then run it here or asynchronously.

    `fingerprint` is (the tensor every rank passes alike, root name, root, op): the call's
    signature, folded into its tag, is built from it: (collective, algorithm, dtype, nbytes,
    op, root name, root), the dtype and op as objects (comm/trace/signature.py names them and turns
    nbytes back into the caller's count). `uneven`: the ranks' byte counts may differ (split
    sizes of their own), so the count stays out of the signature and "auto" cannot price the
    call alike on every rank: it means pairwise, whose messages do not depend on the sizes."""
    if uneven and algorithm == "auto":
        algorithm = "pairwise"
    place = fast.window_of(comm, collective, nbytes, args)  # a buffer from minipar.empty
    if place is not None and algorithm == "auto":
        algorithm = "ring"  # whose order the in-place schedule keeps, fast paths on or off
    name, fn = registry.pick(collective, algorithm, nbytes, comm.size, comm)  # the model picks
    name, fn = fast.route(comm, collective, name, fn, nbytes, args[0] if args else None, place)
    if process.debug:  # the fingerprint is built only here, off the hot path
        _check_same_call(comm, (collective, name, *(_fp(*fingerprint) if fingerprint else ())))
    if fingerprint:  # the call's signature (comm/trace/signature.py), inline: every call comes here
        x, root_name, root, op = fingerprint
        sig = (collective, name, x.dtype, None if uneven else nbytes, op, root_name, root)
    else:
        sig = (collective, name, None, None, None, None, None)
    call = Call(comm, collective, name, sig)

    def run():
        try:
            if process.traces:  # a trace is open: it notes when the call ran, and on which thread
                with ledger.running(comm, call.seq):
                    fn(call, *args)
            else:
                fn(call, *args)
        except SystemExit as leaving:  # the others could never finish this call: end the job
            runtime.exit_inside_collective(call, leaving)
            raise
        except MiniparError:  # the program hears of it (a wait on shared windows, say):
            comm._told = True  # the end-of-job comparison leaves this group be (guards/ending.py)
            raise
        if finish is not None:
            finish()

    if async_op:
        return work.submit(run, f"{collective} ({name}) on group {comm.name}")
    run()
    return None


def _check_same_call(comm, fingerprint) -> None:
    """Debug mode: all ranks of the group must be making the same call with matching arguments.

    Every rank sends its fingerprint (sequence number, collective, algorithm, dtype, shape, root,
    op; pickled into FINGERPRINT_BYTES) to every other rank: p - 1 small messages out and in,
    on a tag of their own, with the group's timeout (which then names a rank that never came).
    Every rank sees the same p fingerprints, so on a mismatch every rank raises the same
    MismatchError, before the call takes its tag: the group stays usable.
    """
    if comm.size == 1:
        return
    fingerprint = (comm._seq, *fingerprint)
    mine = _encode(fingerprint)
    inbox, requests = {}, []
    for q in range(comm.size):
        if q != comm.rank:
            inbox[q] = np.empty_like(mine)
            requests.append(comm._post_recv(inbox[q], q, CONTROL_TAG))
            requests.append(comm._post_send(mine, q, CONTROL_TAG))
    context = (
        f"debug check before {fingerprint[1]} (call #{comm._seq}) on group {comm.name}, "
        f"rank {comm.rank}"
    )
    wait_all(requests, comm.timeout, context)
    mine_bytes = mine.tobytes()
    if all(got.tobytes() == mine_bytes for got in inbox.values()):
        return
    inbox[comm.rank] = mine
    seen = [_decode(inbox[q]) for q in range(comm.size)]
    comm._told = True  # the program is told: the end-of-job comparison leaves this group be
    raise MismatchError(_mismatch_message(comm.name, seen))


FINGERPRINT_BYTES = 1024


def _encode(fingerprint):
    """The fingerprint pickled into a fixed-size uint8 buffer (8-byte length, then the pickle)."""
    data = pickle.dumps(fingerprint)
    if len(data) > FINGERPRINT_BYTES - 8:
        raise MiniparError(f"debug-mode fingerprint too large to exchange: {fingerprint!r}")
    head = len(data).to_bytes(8, "little")
    padding = bytes(FINGERPRINT_BYTES - 8 - len(data))
    return np.frombuffer(bytearray(head + data + padding), dtype=np.uint8)


def _decode(buf):
    n = int.from_bytes(buf[:8].tobytes(), "little")
    return pickle.loads(buf[8 : 8 + n].tobytes())


def _mismatch_message(group: str, seen) -> str:
    """Which ranks called what, one line per distinct call (ranks that agree share a line)."""
    calls: dict = {}
    for rank, f in enumerate(seen):
        calls.setdefault(f, []).append(rank)
    lines = []
    for f, ranks in calls.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        lines.append(f"  {who}: {_render(f)}")
    return (
        f"ranks of group {group} disagree on the collective call (debug mode); "
        "every rank must make the same calls in the same order with matching arguments:\n"
        + "\n".join(lines)
    )


def _render(f) -> str:
    """(seq, collective, algorithm, dtype, shape, root name, root, op) -> readable text."""
    seq, collective, algorithm = f[:3]
    parts = [f"algorithm={algorithm!r}"]
    if len(f) > 3:
        dtype, shape, root_name, root, op = f[3:]
        parts += [f"dtype={dtype}", f"shape={shape}"]
        if root_name is not None:
            parts.append(f"{root_name}={root}")
        if op is not None:
            parts.append(f"op={op}")
    return f"call #{seq} {collective}({', '.join(parts)})"


def _fp(x, root_name=None, root=None, op=None):
    """The arguments debug mode compares: dtype, shape (the caller's), root, op. Callers pass
    `run_call` these arguments as a tuple, so nothing is computed unless debug mode is on."""
    return (buffers.dtype_name(x), tuple(x.shape), root_name, root, getattr(op, "name", None))


def broadcast(tensor, src=None, group=None, algorithm="auto", async_op=False, group_src=None):
    """Copy `tensor` of rank `src` into `tensor` on every rank of the group (in place)."""
    if group is not None and runtime.outside(group, "broadcast"):
        return None
    comm = runtime.resolve(group)
    buffers.check(tensor, "tensor", writable=True)
    src = _root(src, comm, "src", group_src)
    x = buffers.flat(tensor)
    return run_call(
        comm,
        "broadcast",
        algorithm,
        buffers.nbytes(x),
        (x, src),
        async_op,
        fingerprint=(tensor, "src", src, None),
    )


def all_reduce(tensor, op=ReduceOp.SUM, group=None, algorithm="auto", async_op=False):
    """Reduce `tensor` over the group; every rank ends with the result in `tensor`."""
    if group is not None and runtime.outside(group, "all_reduce"):
        return None
    comm = runtime.resolve(group)
    op = as_op(op)
    if not async_op and fast.all_reduce(comm, tensor, op, algorithm):
        return None  # small and blocking: done on the lean path (collectives/fast/lean.py)
    buffers.check(tensor, "tensor", writable=True)
    check_op(op, tensor)
    x = buffers.flat(tensor)
    x = fast.numpy_view(comm, x, op)  # a CPU tensor's steps on numpy's fast path
    return run_call(
        comm,
        "all_reduce",
        algorithm,
        buffers.nbytes(x),
        (x, op),
        async_op,
        finish=lambda: finish_(x, op, comm.size),
        fingerprint=(tensor, None, None, op),
    )


def reduce(
    tensor, dst=None, op=ReduceOp.SUM, group=None, algorithm="auto", async_op=False, group_dst=None
):
    """Reduce `tensor` over the group into `tensor` on rank `dst` (others keep theirs)."""
    if group is not None and runtime.outside(group, "reduce"):
        return None
    comm = runtime.resolve(group)
    op = as_op(op)
    buffers.check(tensor, "tensor", writable=True)
    check_op(op, tensor)
    dst = _root(dst, comm, "dst", group_dst)
    x = buffers.flat(tensor)

    def finish():
        if comm.rank == dst:
            finish_(x, op, comm.size)

    return run_call(
        comm,
        "reduce",
        algorithm,
        buffers.nbytes(x),
        (x, dst, op),
        async_op,
        finish=finish,
        fingerprint=(tensor, "dst", dst, op),
    )


def all_gather_into_tensor(
    output_tensor, input_tensor, group=None, algorithm="auto", async_op=False
):
    """Every rank's `input_tensor`, concatenated in rank order, into `output_tensor`."""
    if group is not None and runtime.outside(group, "all_gather_into_tensor"):
        return None
    comm = runtime.resolve(group)
    buffers.check(output_tensor, "output_tensor", writable=True)
    buffers.check(input_tensor, "input_tensor")
    _matching(output_tensor, input_tensor, "output_tensor", "input_tensor", comm.size)
    out, inp = buffers.flat(output_tensor), buffers.flat(input_tensor)
    return run_call(
        comm,
        "all_gather",
        algorithm,
        buffers.nbytes(out),
        (out, inp),
        async_op,
        fingerprint=(input_tensor, None, None, None),
    )


def all_gather(tensor_list, tensor, group=None, algorithm="auto", async_op=False):
    """Every rank's `tensor` into `tensor_list[rank]` (a list of group-size tensors)."""
    if group is not None and runtime.outside(group, "all_gather"):
        return None
    comm = runtime.resolve(group)
    buffers.check(tensor, "tensor")
    check_list(tensor_list, tensor, comm, "tensor_list", writable=True)
    inp = buffers.flat(tensor)
    out = buffers.empty(inp, comm.size * len(inp))
    n = len(inp)

    def scatter_into_list():
        for r, t in enumerate(tensor_list):
            buffers.copy_(buffers.flat(t), out[r * n : (r + 1) * n])

    return run_call(
        comm,
        "all_gather",
        algorithm,
        buffers.nbytes(out),
        (out, inp),
        async_op,
        finish=scatter_into_list,
        fingerprint=(tensor, None, None, None),
    )


def check_list(tensors, like, comm, what: str, writable: bool = False, like_what="tensor"):
    if not isinstance(tensors, (list, tuple)) or len(tensors) != comm.size:
        got = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
        raise ValueError(
            f"{what} must be a list of {comm.size} tensors (the group size), got {got}"
        )
    for i, t in enumerate(tensors):
        buffers.check(t, f"{what}[{i}]", writable=writable)
        _matching(t, like, f"{what}[{i}]", like_what)
        if tuple(t.shape) != tuple(like.shape):
            raise ValueError(
                f"{what}[{i}] has shape {tuple(t.shape)} but {like_what} has shape "
                f"{tuple(like.shape)}; every entry must have the {like_what}'s shape"
            )


def reduce_scatter_tensor(
    output, input, op=ReduceOp.SUM, group=None, algorithm="auto", async_op=False
):
    """Reduce `input` (group-size blocks) over the group; rank r gets block r in `output`."""
    if group is not None and runtime.outside(group, "reduce_scatter_tensor"):
        return None
    comm = runtime.resolve(group)
    op = as_op(op)
    buffers.check(output, "output", writable=True)
    buffers.check(input, "input")
    check_op(op, input)
    _matching(output, input, "output", "input", comm.size, inverse=True)
    out, inp = buffers.flat(output), buffers.flat(input)
    return run_call(
        comm,
        "reduce_scatter",
        algorithm,
        buffers.nbytes(inp),
        (out, inp, op),
        async_op,
        finish=lambda: finish_(out, op, comm.size),
        fingerprint=(input, None, None, op),
    )


def scatter(
    tensor,
    scatter_list=None,
    src=None,
    group=None,
    algorithm="auto",
    async_op=False,
    group_src=None,
):
    """Rank `src` sends scatter_list[r] to rank r, which receives it into `tensor`."""
    if group is not None and runtime.outside(group, "scatter"):
        return None
    comm = runtime.resolve(group)
    buffers.check(tensor, "tensor", writable=True)
    src = _root(src, comm, "src", group_src, default=0)
    out = buffers.flat(tensor)
    inp = None
    if comm.rank == src:
        check_list(scatter_list, tensor, comm, "scatter_list")
        inp = buffers.empty(out, comm.size * len(out))
        for r, t in enumerate(scatter_list):
            buffers.copy_(inp[r * len(out) : (r + 1) * len(out)], buffers.flat(t))
    nbytes = comm.size * buffers.nbytes(out)
    return run_call(
        comm,
        "scatter",
        algorithm,
        nbytes,
        (out, inp, src),
        async_op,
        fingerprint=(tensor, "src", src, None),
    )


def gather(
    tensor,
    gather_list=None,
    dst=None,
    group=None,
    algorithm="auto",
    async_op=False,
    group_dst=None,
):
    """Every rank's `tensor` into gather_list[rank] on rank `dst`."""
    if group is not None and runtime.outside(group, "gather"):
        return None
    comm = runtime.resolve(group)
    buffers.check(tensor, "tensor")
    dst = _root(dst, comm, "dst", group_dst, default=0)
    inp = buffers.flat(tensor)
    out, finish = None, None
    if comm.rank == dst:
        check_list(gather_list, tensor, comm, "gather_list", writable=True)
        out = buffers.empty(inp, comm.size * len(inp))
        n = len(inp)

        def finish():
            for r, t in enumerate(gather_list):
                buffers.copy_(buffers.flat(t), out[r * n : (r + 1) * n])

    nbytes = comm.size * buffers.nbytes(inp)
    return run_call(
        comm,
        "gather",
        algorithm,
        nbytes,
        (out, inp, dst),
        async_op,
        finish=finish,
        fingerprint=(tensor, "dst", dst, None),
    )


def all_to_all_single(
    output,
    input,
    output_split_sizes=None,
    input_split_sizes=None,
    group=None,
    algorithm="auto",
    async_op=False,
):
    """Block j of rank i's `input` goes to block i of rank j's `output`.

    Without split sizes the blocks are equal (numel / group size). With them, as in torch, block
    j of input is input_split_sizes[j] rows (dim 0) and block i of output is
    output_split_sizes[i] rows; a missing one means equal rows. Ranks must agree on the sizes
    (what i sends j is what j expects from i), else the transport's size check fails."""
    if group is not None and runtime.outside(group, "all_to_all_single"):
        return None
    comm = runtime.resolve(group)
    buffers.check(output, "output", writable=True)
    buffers.check(input, "input")
    same_type(output, input, "output", "input")
    if buffers.overlaps(output, input):
        raise ValueError(
            "all_to_all_single needs separate output and input buffers (they share memory: "
            "blocks would be overwritten before they are sent)"
        )
    out, inp = buffers.flat(output), buffers.flat(input)
    args = (out, inp)
    if output_split_sizes is None and input_split_sizes is None:
        _matching(output, input, "output", "input")
        if buffers.numel(input) % comm.size:
            raise ValueError(
                f"input has {buffers.numel(input)} elements, not divisible by the group size "
                f"{comm.size}"
            )
    else:
        out_edges = split_edges(output, output_split_sizes, comm, "output_split_sizes", "output")
        in_edges = split_edges(input, input_split_sizes, comm, "input_split_sizes", "input")
        args = (out, inp, *equal_or(out_edges, in_edges, comm.size))
    return run_call(
        comm,
        "all_to_all",
        algorithm,
        buffers.nbytes(inp),
        args,
        async_op,
        fingerprint=(input, None, None, None),
        uneven=output_split_sizes is not None or input_split_sizes is not None,
    )


def split_edges(x, splits, comm, what: str, name: str) -> list[int]:
    """Element offsets (p + 1) of x's blocks: `splits` rows of dim 0 each, or equal rows."""
    rows = x.shape[0] if len(x.shape) else 1
    p = comm.size
    if splits is None:
        if rows % p:
            raise ValueError(
                f"{name} has {rows} rows (dim 0), not divisible by the group size {p}; pass {what}"
            )
        splits = [rows // p] * p
    splits = list(splits) if isinstance(splits, (list, tuple)) else splits
    if (
        not isinstance(splits, list)
        or len(splits) != p
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in splits)
    ):
        raise ValueError(
            f"{what}={splits!r} must be a list of {p} non-negative ints (one per rank of "
            f"group {comm.name})"
        )
    if sum(splits) != rows:
        raise ValueError(
            f"{what}={splits} sums to {sum(splits)} but {name} has {rows} rows (dim 0)"
        )
    per_row = buffers.numel(x) // rows if rows else 0
    edges = [0]
    for n in splits:
        edges.append(edges[-1] + n * per_row)
    return edges


def equal_or(out_edges, in_edges, p: int) -> tuple:
    """() when every block is the same size on both sides (the algorithms' plain form, which a
    user-registered algorithm also has), else the edges the algorithms take."""
    n = in_edges[-1] // p if p else 0
    even = [i * n for i in range(p + 1)]
    return () if out_edges == even and in_edges == even else (out_edges, in_edges)


def barrier(group=None, algorithm="auto", async_op=False):
    """Return only when every rank of the group has entered (dissemination algorithm)."""
    if group is not None and runtime.outside(group, "barrier"):
        return None
    comm = runtime.resolve(group)
    return run_call(comm, "barrier", algorithm, 0, (), async_op)
