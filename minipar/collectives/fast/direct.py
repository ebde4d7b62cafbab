"""Fast path: one step's messages straight on mpi4py's requests, the short way for numpy buffers.

A step of a collective receives one buffer and sends another. Through the transport's Request
objects (comm/transport/base.py) that costs about 4 us of Python on top of the 3 us the two messages
cost in bare mpi4py: two Request objects, a Status each, a wait loop over a list. Most steps finish
within microseconds, so `exchange` posts mpi4py's own requests and polls them a little; only a
step still pending after that is wrapped in Request objects and handed to `wait_all`, which
yields the core, notices a mismatch found by the watchdog, and times out naming the peer.

    exchange(comm, sendbuf, dst, recvbuf, src, tag, where, step)   # dst or src may be None

What is kept on this path: the message's size check (a shorter message is an error, a longer one
MPI's truncation, both said as MessageSizeError), the timeout and its message, and abandoning a
send still in flight after an error (its buffer kept alive). Sends of at most EAGER_BYTES are
blocking MPI_Sends: MPI buffers such a message at the receiver and returns at once, so it
cannot hang on an absent peer, and it saves a request.
"""

from __future__ import annotations

import threading

from minipar.comm.transport.base import SPIN_SECONDS, abandon, wait_all
from minipar.comm.transport.mpi_requests import MPIRequest, check_count, module, raise_if_truncated

# A blocking MPI_Send of this few bytes returns at once in every MPI (the message goes eagerly,
# buffered at the receiver). Larger sends may wait for the receiver (rendezvous): Isends, whose
# waits time out.
EAGER_BYTES = 256
# polls of a step's requests before handing them to wait_all: none when ranks outnumber cores,
# where spinning only steals the core from the peer we wait for
SPINS = 0 if SPIN_SECONDS == 0 else 200
_status_cache = threading.local()  # a cache: one MPI Status per thread, read right after its Test


def exchange(comm, sendbuf, dst, recvbuf, src, tag: int, where, step: int) -> None:
    """Receive numpy `recvbuf` from `src` and send numpy `sendbuf` to `dst` under `tag` on the
    MPI group `comm` (either peer None: that half is skipped). `where(step)` describes the place
    for a timeout's message (called only then)."""
    MPI = module()
    mpi, BYTE = comm.mpi, MPI.BYTE
    recv = send = None
    if src is not None:
        recv = mpi.Irecv([recvbuf, BYTE], src, tag)
    if dst is not None and sendbuf.nbytes <= EAGER_BYTES:
        mpi.Send([sendbuf, BYTE], dst, tag)  # returns at once: see EAGER_BYTES
    elif dst is not None:
        send = mpi.Isend([sendbuf, BYTE], dst, tag)
    status = getattr(_status_cache, "status", None) or _new_status(MPI)
    try:
        for _ in range(SPINS):  # the common case: done within a few polls
            if recv is not None and recv.Test(status):
                recv = None
                if status.Get_count(BYTE) != recvbuf.nbytes:
                    check_count(status, comm, src, tag, recvbuf.nbytes)
            if send is not None and send.Test():
                send = None
            if recv is None and send is None:
                return
    except BaseException as error:  # a wrong size, MPI's truncation, an interrupt
        failed(comm, error, recv, send, tag, sendbuf, dst, recvbuf, src)
    still_pending(comm, recv, send, tag, sendbuf, dst, recvbuf, src, where, step)


def failed(comm, error, recv, send, tag: int, sendbuf, dst, recvbuf, src) -> None:
    """Raise `error` (MPI's truncation said as MessageSizeError) after abandoning the step's
    requests still in flight: their buffers are kept alive, as MPI may still touch them."""
    abandon(_wrap(comm, recv, send, tag, sendbuf, dst, recvbuf, src))
    comm._told = True  # the program sees this group fail (comm/guards/ending.py)
    if recvbuf is not None and isinstance(error, module().Exception):
        raise_if_truncated(error, comm, src, tag, recvbuf.nbytes)
    raise error


def still_pending(comm, recv, send, tag: int, sendbuf, dst, recvbuf, src, where, step) -> None:
    """The requests left after the spin, handed to the general waiter: it yields the core,
    checks sizes, notices a mismatch and times out naming `where(step)` and the peer."""
    pending = _wrap(comm, recv, send, tag, sendbuf, dst, recvbuf, src)
    if pending:
        wait_all(pending, comm.timeout, lambda: where(step))


def _new_status(MPI):
    _status_cache.status = MPI.Status()
    return _status_cache.status


def _wrap(comm, recv, send, tag: int, sendbuf, dst, recvbuf, src) -> list:
    """The step's pending mpi4py requests as the transport's own Request objects."""
    pending = []
    if recv is not None:
        pending.append(MPIRequest(comm, "recv", src, tag, recvbuf.nbytes, recv, recvbuf))
    if send is not None:
        pending.append(MPIRequest(comm, "send", dst, tag, sendbuf.nbytes, send, sendbuf))
    return pending
