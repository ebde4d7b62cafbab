"""Fast path, the lean one: a small blocking all-reduce with nothing between the caller and
mpi4py but what protects the caller.

A training loop all-reduces the same few small things again and again (a loss, a gradient norm,
a flag), and at 8 bytes the time is all Python: the general path re-derives on every call what
never changes between calls (the algorithm the cost model picks, the transport, the call's
signature and its hash, the butterfly's partners, a scratch buffer, the reduction kernel) and
wraps every message in a Request object. Here that is worked out once, in a `Plan` cached per
(group, algorithm, dtype, count, op, thread), and each call runs the plan's steps on mpi4py's
own requests:

    per step: comm/mpi_direct.exchange (Irecv into scratch, send x, poll), x = low op high

The messages are the very ones recursive.all_reduce_recursive_doubling sends (same tag, sizes,
order and arithmetic), so a rank on this path and one on the general path (say, one with a trace
recording) still meet, and their results are bitwise identical. What stays on the path:
- the argument checks (the plan is only built, and cached, once they pass; the per-object ones,
  contiguous and writable, run on every call);
- the call's tag: its sequence number and the hash of its signature, so ranks that disagree
  about the call still never match and the watchdog still finds them;
- every message's size check, and the timeout naming the collective, step and peer (both in
  mpi_direct.exchange, which the general path's steps on numpy buffers use too).

Taken only when the result is the same as the general path's by construction: blocking calls on
an MPI group, numpy arrays or CPU torch tensors (torch: the exactly-rounded ops only, where
numpy's and torch's kernels agree bit for bit), at most MAX_BYTES, the algorithm (named or
chosen by `auto`) recursive doubling on MPI, no trace recording and no debug mode.
"""

from __future__ import annotations

import threading

import numpy as np

from minipar import cost
from minipar.collectives import layout, registry
from minipar.collectives.fast import routing
from minipar.collectives.fast.direct import EAGER_BYTES, SPINS, failed, still_pending
from minipar.collectives.reduce_op import ReduceOp, check_op, numpy_kernel
from minipar.comm.trace import signature
from minipar.comm.transport import buffers
from minipar.comm.transport.mpi_requests import check_count, module
from minipar.state import process

MAX_BYTES = 64 << 10  # the latency regime; a plan keeps a scratch buffer of this size at most
EXACT_OPS = (
    ReduceOp.SUM,
    ReduceOp.AVG,
    ReduceOp.PRODUCT,
    ReduceOp.BAND,
    ReduceOp.BOR,
    ReduceOp.BXOR,
)
_get_ident = threading.get_ident
_NOT_YET = object()


class Plan:
    """What a call of this shape does, worked out once: `steps` is the schedule as data, one
    (send_to, recv_from, mode) per step, mode "low" (x = incoming op x: the partner is the lower
    rank), "high" (x = x op incoming), "copy" (received straight into x) or None (send only)."""

    __slots__ = ("comm", "steps", "sig", "sig_hash", "kernel", "scratch", "link", "avg")
    __slots__ += ("status", "byte", "theirs")

    def __init__(self, comm, steps, sig, kernel, scratch, link, avg):
        self.comm, self.steps, self.sig, self.kernel = comm, steps, sig, kernel
        self.scratch, self.link, self.avg = scratch, link, avg
        self.sig_hash = signature.tag_hash(sig)
        MPI = module()
        self.status, self.byte = MPI.Status(), MPI.BYTE
        self.theirs = [scratch, MPI.BYTE]  # the receive buffer, as mpi4py takes it

    def where(self, step: int) -> str:
        """Where this rank was, for a timeout's message (built only if one happens)."""
        comm = self.comm
        return (
            f"all_reduce (algorithm recursive_doubling) on group {comm.name}, "
            f"rank {comm.rank}, step {step}"
        )


def schedule(rank: int, p: int) -> list[tuple]:
    """Recursive doubling's steps for `rank` of `p`, folding the first 2 rem ranks as
    recursive.py does: (send_to, recv_from, mode) per step."""
    p2, rem = layout.fold(p)
    me = layout.folded_rank(rank, rem)
    steps = []
    if rem and rank < 2 * rem:
        steps.append((rank + 1, None, None) if me is None else (None, rank - 1, "high"))
    if me is not None:
        for k in range(p2.bit_length() - 1):
            partner = layout.unfolded_rank(me ^ (1 << k), rem)
            steps.append((partner, partner, "low" if partner < rank else "high"))
    if rem and rank < 2 * rem:
        steps.append((None, rank + 1, "copy") if me is None else (rank - 1, None, None))
    return steps


def all_reduce(comm, tensor, op: ReduceOp, algorithm) -> bool:
    """Run a blocking all_reduce on the lean path if it qualifies; False to take the general one
    (which then makes every check and raises every error itself). `op` is already a ReduceOp.
    Every microsecond here is a sixth of the call: module attributes are read, not called."""
    if type(tensor) is np.ndarray:
        flags = tensor.flags
        if not (flags.c_contiguous and flags.writeable):
            return False
        x = tensor if tensor.ndim == 1 else tensor.reshape(-1)
    else:
        x = _torch_view(tensor, op)
        if x is None:
            return False
    plans = getattr(comm, "_lean", None)
    if plans is None:
        return False  # not an MPI group
    key = (x.dtype, x.size, op, algorithm, _get_ident())
    plan = plans.get(key, _NOT_YET)
    if plan is _NOT_YET:
        plan = _plan(comm, x, op, algorithm)
        if len(plans) > 256:
            plans.clear()
        plans[key] = plan
    if (
        plan is None
        or plan.link is not process.links.get("mpi")  # auto may pick otherwise now
        or process.traces  # a trace records every message: the general path does that
        or process.debug
        or routing.env_raw() not in routing.AUTO_RAW
    ):
        return False
    _run(plan, x)
    return True


def _torch_view(tensor, op):
    """A 1-D numpy view of a CPU tensor's memory, if the lean path can take it; None sends
    anything unusual (bfloat16, sparse, meta, a conjugate view) to the general path, which
    handles it or says what is wrong with it."""
    if op not in EXACT_OPS or not buffers.is_torch(tensor):
        return None
    try:
        if tensor.is_cuda or not tensor.is_contiguous():
            return None
        return tensor.detach().reshape(-1).numpy()
    except (TypeError, RuntimeError):
        return None


def _plan(comm, x, op, algorithm) -> Plan | None:
    """The plan for this shape of call, or None when the general path must take it."""
    check_op(op, x)  # raises, as the general path would, and nothing is cached
    nbytes = x.nbytes
    if nbytes > MAX_BYTES or not isinstance(algorithm, str) or x.dtype.hasobject:
        return None
    link = cost.default_link()
    name = registry.pick("all_reduce", algorithm, nbytes, comm.size, comm)[0]
    if name != "recursive_doubling" and not (
        comm.size == 1 and name in registry.BUILTIN["all_reduce"]
    ):
        return None  # (on one rank every built-in sends nothing: the plan has no steps)
    sig = ("all_reduce", "recursive_doubling", x.dtype, nbytes, op, None, None)
    kernel = numpy_kernel(op, x.dtype)
    scratch = np.empty_like(x)
    steps = schedule(comm.rank, comm.size)
    return Plan(comm, steps, sig, kernel, scratch, link, op is ReduceOp.AVG)


def _run(plan: Plan, x) -> None:
    """The plan's steps; each is comm/mpi_direct.exchange written out inline (the same requests,
    spin, size check and fallbacks), which saves a call and a few lookups a step: a tenth of an
    8-byte all-reduce."""
    comm, status, scratch, kernel = plan.comm, plan.status, plan.scratch, plan.kernel
    mpi, BYTE, nbytes = comm.mpi, plan.byte, x.nbytes
    _, tag = comm.next_collective_tag(plan.sig, plan.sig_hash)
    mine, theirs = [x, BYTE], plan.theirs
    for step, (send_to, recv_from, mode) in enumerate(plan.steps):
        into = x if mode == "copy" else scratch
        recv = send = None
        if recv_from is not None:
            recv = mpi.Irecv(mine if mode == "copy" else theirs, recv_from, tag)
        if send_to is not None and nbytes <= EAGER_BYTES:
            mpi.Send(mine, send_to, tag)  # returns at once: see mpi_direct.EAGER_BYTES
        elif send_to is not None:
            send = mpi.Isend(mine, send_to, tag)
        try:
            for _ in range(SPINS):
                if recv is not None and recv.Test(status):
                    recv = None
                    if status.Get_count(BYTE) != nbytes:
                        check_count(status, comm, recv_from, tag, into.nbytes)
                if send is not None and send.Test():
                    send = None
                if recv is None and send is None:
                    break
        except BaseException as error:
            failed(comm, error, recv, send, tag, x, send_to, into, recv_from)
        if recv is not None or send is not None:
            still_pending(comm, recv, send, tag, x, send_to, into, recv_from, plan.where, step)
        if mode == "low":
            kernel(scratch, x, out=x)
        elif mode == "high":
            kernel(x, scratch, out=x)
    if plan.avg and comm.size > 1:
        np.divide(x, comm.size, out=x, casting="unsafe")
