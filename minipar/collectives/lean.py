"""The lean path: a small blocking all-reduce with nothing between the caller and mpi4py but
what protects the caller.

A training loop all-reduces the same few small things again and again (a loss, a gradient norm,
a flag), and at 8 bytes the time is all Python: the general path re-derives on every call what
never changes between calls (the algorithm the cost model picks, the transport, the call's
signature and its hash, the butterfly's partners, a scratch buffer, the reduction kernel) and
wraps every message in a Request object. Here that is worked out once, in a `Plan` cached per
(group, algorithm, dtype, count, op, thread), and each call runs the plan's steps on mpi4py's
own requests:

    per step: Irecv into scratch, send x, poll, x = low op high (a cached ufunc)

The messages are the very ones recursive.all_reduce_recursive_doubling sends (same tag, sizes,
order and arithmetic), so a rank on this path and one on the general path (say, one with a trace
recording) still meet, and their results are bitwise identical. What stays on the path:
- the argument checks (the plan is only built, and cached, once they pass; the per-object ones,
  contiguous and writable, run on every call);
- the call's tag: its sequence number and the hash of its signature, so ranks that disagree
  about the call still never match and the watchdog still finds them;
- every message's size check;
- the timeout: after a short spin a step falls back to the general waiter (comm/base.py), which
  yields the core, times out naming the collective, step and peer, and notices a mismatch.

Taken only when the result is the same as the general path's by construction: blocking calls on
an MPI group, numpy arrays or CPU torch tensors (torch: the exactly-rounded ops only, where
numpy's and torch's kernels agree bit for bit), at most MAX_BYTES, the algorithm (named or
chosen by `auto`) recursive doubling on MPI, no trace recording and no debug mode.
"""

from __future__ import annotations

import threading

import numpy as np

from minipar import buffers, cost, ledger, runtime
from minipar.collectives import layout, registry, transport
from minipar.comm import signature
from minipar.comm.base import _SPIN_SECONDS, abandon, wait_all
from minipar.ops import _NUMPY, _NUMPY_BOOL, ReduceOp, check_op

MAX_BYTES = 64 << 10  # the latency regime; a plan keeps a scratch buffer of this size at most
# A blocking MPI_Send of this few bytes returns at once in every MPI (they go eagerly, buffered at
# the receiver), so it cannot hang on an absent peer and skips a request: a third of the Python
# on an 8 B step. Larger sends may wait for the receiver (rendezvous), so they are Isends whose
# waits time out.
EAGER_BYTES = 256
_EXACT = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)
# polls of a step's two requests before handing over to the general waiter (which yields): none
# when ranks outnumber cores, where spinning only steals the core from the peer we wait for
SPINS = 0 if _SPIN_SECONDS == 0 else 200
_get_ident = threading.get_ident
_NOT_YET = object()


class Plan:
    """What a call of this shape does, worked out once: `steps` is the schedule as data, one
    (send_to, recv_from, mode) per step, mode "low" (x = incoming op x: the partner is the lower
    rank), "high" (x = x op incoming), "copy" (received straight into x) or None (send only)."""

    __slots__ = ("comm", "steps", "sig", "sig_hash", "kernel", "scratch", "theirs")
    __slots__ += ("link", "avg", "status", "mpi")

    def __init__(self, comm, steps, sig, kernel, scratch, link, avg):
        self.comm, self.steps, self.sig, self.kernel = comm, steps, sig, kernel
        self.scratch, self.link, self.avg = scratch, link, avg
        self.mpi = _mpi()
        self.status = self.mpi.Status()
        self.sig_hash = signature.tag_hash(sig)
        self.theirs = [scratch, self.mpi.BYTE]  # the receive buffer, as mpi4py takes it


def _mpi():
    from minipar.comm.mpi import _mpi

    return _mpi()


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
        or plan.link is not cost._default[0]  # auto may pick otherwise now
        or ledger._active  # a trace records every message: the general path does that
        or runtime._state.debug
        or transport._env_raw() not in transport._AUTO_RAW
    ):
        return False
    _run(plan, x)
    return True


def _torch_view(tensor, op):
    """A 1-D numpy view of a CPU tensor's memory, if the lean path can take it; None sends
    anything unusual (bfloat16, sparse, meta, a conjugate view) to the general path, which
    handles it or says what is wrong with it."""
    if op not in _EXACT or not buffers.is_torch(tensor):
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
    name = registry.pick("all_reduce", algorithm, nbytes, comm.size)[0]
    if name != "recursive_doubling" and not (
        comm.size == 1 and name in registry._BUILTIN["all_reduce"]
    ):
        return None  # (on one rank every built-in sends nothing: the plan has no steps)
    sig = ("all_reduce", "recursive_doubling", x.dtype, nbytes, op, None, None)
    kernel = (_NUMPY_BOOL if x.dtype == np.bool_ else _NUMPY)[op]
    scratch = np.empty_like(x)
    steps = schedule(comm.rank, comm.size)
    return Plan(comm, steps, sig, kernel, scratch, link, op is ReduceOp.AVG)


def _run(plan: Plan, x) -> None:
    comm, MPI, status = plan.comm, plan.mpi, plan.status
    mpi, BYTE, nbytes = comm.mpi, MPI.BYTE, x.nbytes
    _, tag = comm.next_collective_tag(plan.sig, plan.sig_hash)
    mine, theirs = [x, BYTE], plan.theirs
    for step, (send_to, recv_from, mode) in enumerate(plan.steps):
        recv = send = None
        if recv_from is not None:
            recv = mpi.Irecv(mine if mode == "copy" else theirs, recv_from, tag)
        if send_to is not None and nbytes <= EAGER_BYTES:
            mpi.Send(mine, send_to, tag)  # returns at once: see EAGER_BYTES
        elif send_to is not None:
            send = mpi.Isend(mine, send_to, tag)
        try:
            for _ in range(SPINS):  # the common case: done within a few polls
                if recv is not None and recv.Test(status):
                    recv = None
                    if status.Get_count(BYTE) != nbytes:
                        _wrong_size(plan, status, tag, x, recv_from, mode)
                if send is not None and send.Test():
                    send = None
                if recv is None and send is None:
                    break
            else:
                _wait(plan, recv, send, tag, step, x, send_to, recv_from, mode)
        except MPI.Exception as error:
            _failed(plan, error, send, tag, x, send_to, recv_from, mode)
        if mode == "low":
            plan.kernel(theirs[0], x, out=x)
        elif mode == "high":
            plan.kernel(x, theirs[0], out=x)
    if plan.avg and comm.size > 1:
        np.divide(x, comm.size, out=x, casting="unsafe")


def _wrong_size(plan: Plan, status, tag: int, x, recv_from, mode) -> None:
    from minipar.comm.mpi import check_count

    into = x if mode == "copy" else plan.scratch
    check_count(status, plan.comm, recv_from, tag, into.nbytes)


def _failed(plan: Plan, error, send, tag: int, x, send_to, recv_from, mode) -> None:
    """An MPI error while polling (a message larger than the buffer): said plainly, and the send
    still in flight is abandoned with its buffer kept alive (comm/base.py)."""
    from minipar.comm.mpi import raise_if_truncated

    into = x if mode == "copy" else plan.scratch
    abandon(_wrap(plan, None, send, tag, x, send_to, into, recv_from))
    raise_if_truncated(error, plan.comm, recv_from, tag, into.nbytes)
    raise error


def _wait(plan: Plan, recv, send, tag: int, step: int, x, send_to, recv_from, mode) -> None:
    """The step's requests, still pending after the spin, handed to the general waiter: it
    yields the core, checks sizes, notices a mismatch and times out naming the peer. (Not MPI 4's
    Isendrecv, one request for both: MPICH 5.0's fills its status with a wrong count.)"""
    into = x if mode == "copy" else plan.scratch
    pending = _wrap(plan, recv, send, tag, x, send_to, into, recv_from)
    wait_all(pending, plan.comm.timeout, lambda: _context(plan, step))


def _wrap(plan: Plan, recv, send, tag: int, x, send_to, into, recv_from) -> list:
    """The step's pending mpi4py requests as the transport's own Request objects."""
    from minipar.comm.mpi import MPIRequest

    pending = []
    if recv is not None:
        pending.append(MPIRequest(plan.comm, "recv", recv_from, tag, into.nbytes, recv, into))
    if send is not None:
        pending.append(MPIRequest(plan.comm, "send", send_to, tag, x.nbytes, send, x))
    return pending


def _context(plan: Plan, step: int) -> str:
    comm = plan.comm
    return (
        f"all_reduce (algorithm recursive_doubling) on group {comm.name}, rank {comm.rank}, "
        f"step {step}"
    )
