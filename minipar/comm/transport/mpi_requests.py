"""The MPI transport's requests: one message (or one nonblocking MPI collective) in flight.

    MPIRequest(comm, "recv", peer, tag, nbytes, mpi4py_request, buffer)   .test() .wait()

Each wraps an mpi4py request and checks, when it completes, that a receive got exactly as many
bytes as its buffer holds (MessageSizeError otherwise). `module()` is the mpi4py.MPI module,
imported on first use: importing it initialises MPI, which minipar leaves to `minipar.init()`.
"""

from __future__ import annotations

from minipar.comm.setup.mpisetup import no_library
from minipar.comm.transport import buffers
from minipar.comm.transport.base import Request
from minipar.errors import MessageSizeError

_module_cache = []  # a cache: mpi4py.MPI once imported (an import in the function costs ~0.5 us)


def module():
    """The mpi4py.MPI module (imported on the first call; later calls read it)."""
    if not _module_cache:
        try:
            from mpi4py import MPI  # here, not at the top: importing it initialises MPI
        except RuntimeError as error:  # no libmpi: say how to get one, not mpi4py's .so list
            raise no_library(error) from None
        _module_cache.append(MPI)
    return _module_cache[0]


def raise_if_truncated(error, comm, peer, tag, nbytes) -> None:
    """An MPI error from a receive whose message was larger than its buffer, said plainly."""
    if error.Get_error_class() == module().ERR_TRUNCATE:
        raise MessageSizeError(
            f"message from rank {peer} (tag {tag}) on group {comm.name} is larger than the "
            f"{nbytes}-byte receive buffer of rank {comm.rank}; sizes must match on both sides"
        ) from None


def check_count(status, comm, peer, tag, nbytes) -> None:
    """A completed receive must have filled its buffer: a shorter message is an error too."""
    got = status.Get_count(module().BYTE)
    if got != nbytes:
        raise MessageSizeError(
            f"rank {comm.rank} of group {comm.name} expected {nbytes} bytes from rank {peer} "
            f"(tag {tag}) but {got} arrived; sizes must match on both sides"
        )


class MPIRequest(Request):
    def __init__(self, comm, kind, peer, tag, nbytes, mpi_request, keep, staged=None, target=None):
        super().__init__(comm, kind, peer, tag, nbytes)
        self._req, self._keep = mpi_request, keep  # keep: the buffer MPI is using, kept alive
        self._staged, self._target = staged, target
        self._status = module().Status() if kind == "recv" else None  # to check the size

    def _poll(self) -> bool:
        MPI = module()
        try:
            done = self._req.Test(self._status)
        except MPI.Exception as error:
            raise_if_truncated(error, self.comm, self.peer, self.tag, self.nbytes)
            raise
        if done and self.kind == "recv":
            check_count(self._status, self.comm, self.peer, self.tag, self.nbytes)
        return done

    def _cancel(self) -> None:
        if self.kind == "recv":  # a receive not yet matched can be withdrawn; a send cannot
            try:
                self._req.Cancel()
            except module().Exception:
                pass

    def _finish(self) -> None:
        if self._staged is not None:
            if self._target is not None:  # a staged receive: host -> device
                buffers.byte_view(self._target).copy_(self._staged)
            self.comm._pool.give(self._staged)
            self._staged = None


class MPIAnySourceRequest(MPIRequest):
    """A receive from any rank (MPI_ANY_SOURCE): `peer` becomes the sender once it arrived."""

    def _poll(self) -> bool:
        done = super()._poll()
        if done:
            self.peer = self._status.Get_source()
        return done

    def describe(self) -> str:
        return (
            f"recv of {self.nbytes} bytes from any rank (tag {self.tag}) on group "
            f"{self.comm.name}, as rank {self.comm.rank}"
        )


class MPIBarrierRequest(MPIRequest):
    """A nonblocking MPI collective (Ibarrier, Iallgather): done when every rank has joined."""

    what = "reach the barrier"

    def describe(self) -> str:
        return f"the other ranks of group {self.comm.name} to {self.what}"

    def _cancel(self) -> None:
        # MPI cannot withdraw a nonblocking collective: the abandoned one would complete with the
        # group's next one of its kind and hand it wrong data. The group's control channel is
        # spent; later control calls refuse to run (see MPICommunicator._control_usable).
        self.comm._control_spent = f"{self.what} timed out on group {self.comm.name}"


class MPIControlRequest(MPIBarrierRequest):
    what = "join a control all-gather (allgather_object)"
