"""The MPI transport's requests for a pipelined staged message (see comm/transport/staging.py): one
logical send or receive made of k chunk messages, each a plain MPIRequest with its size check.

An 8-byte header message, the whole message's size, goes first: chunk sizes alone cannot tell a
2-chunk receive from the first two chunks of a 3-chunk send, the header can (and a plain,
unchunked receive on the other end gets 8 bytes where it expected more, so it fails too). It is
its own message rather than a prefix of chunk 0, so that the pinned buffer holds exactly the
data (the pool rounds sizes up to a power of two: n + 8 bytes would take a block of 2n)."""

from __future__ import annotations

import numpy as np

from minipar.comm.trace import ledger
from minipar.comm.transport import buffers, staging
from minipar.comm.transport.base import Request
from minipar.comm.transport.mpi_requests import MPIAnySourceRequest, MPIRequest, module
from minipar.errors import MessageSizeError


class PipelinedSend(Request):
    """Chunk i goes to MPI as soon as its device -> host copy has finished."""

    def __init__(self, comm, buf, dst: int, tag: int):
        nbytes = buffers.nbytes(buf)
        super().__init__(comm, "send", dst, tag, nbytes)
        raw = buffers.byte_view(buf)
        self._pinned = buffers.is_cuda(buf)  # else a CPU tensor under MINIPAR_STAGE_HOST
        self._host = _host_buffer(comm, raw, self._pinned)
        self._pieces = staging.bounds(nbytes, comm._chunk)
        copier = staging.Copier(buf)
        self._copies = [copier.copy(self._host[a:b], raw[a:b]) for a, b in self._pieces]
        self._raw = raw  # the copies still read it: keep it alive until they are done
        header = np.array([nbytes], dtype=np.int64)
        req = comm.mpi.Isend([header, module().BYTE], dst, tag)
        self._open = [MPIRequest(comm, "send", dst, tag, 8, req, header)]  # not yet complete
        self._parts: list = []  # the chunk sends posted so far
        ledger.note_path(comm, "send", dst, nbytes, "staged-pipelined")

    def _poll(self) -> bool:
        while len(self._parts) < len(self._pieces) and self._copies[len(self._parts)].ready():
            a, b = self._pieces[len(self._parts)]
            wire = self._host[a:b].numpy()
            req = self.comm.mpi.Isend([wire, module().BYTE], self.peer, self.tag)
            part = MPIRequest(self.comm, "send", self.peer, self.tag, wire.size, req, wire)
            self._parts.append(part)
            self._open.append(part)
        self._open = [p for p in self._open if not p._poll()]
        return len(self._parts) == len(self._pieces) and not self._open

    def _finish(self) -> None:
        if self._pinned:
            self.comm._pinned().give(self._host)


class PipelinedRecv(Request):
    """All chunk receives are posted at once (after the first, for a receive from any rank);
    chunk i's host -> device copy starts as soon as it has landed."""

    def __init__(self, comm, buf, src: int | None, tag: int):
        nbytes = buffers.nbytes(buf)
        super().__init__(comm, "recv", -1 if src is None else src, tag, nbytes)
        self._raw = buffers.byte_view(buf)
        cuda = buffers.is_cuda(buf)
        self._host = _host_buffer(comm, self._raw, cuda)
        self._pinned = cuda
        self._pieces = staging.bounds(nbytes, comm._chunk)
        self._copier = staging.Copier(buf)
        self._parts: list = []
        self._copies: list = []
        self._header = np.zeros(1, dtype=np.int64)
        self._header_req = self._post(self._header, src)
        self._header_done = False
        if src is not None:  # else: once the header says who sends
            self._post_chunks(src)
        ledger.note_path(comm, "recv", self.peer, nbytes, "staged-pipelined")

    def _post(self, wire, src):
        MPI = module()
        peer = MPI.ANY_SOURCE if src is None else src
        req = self.comm.mpi.Irecv([wire, MPI.BYTE], peer, self.tag)
        kind = MPIAnySourceRequest if src is None else MPIRequest
        return kind(self.comm, "recv", -1 if src is None else src, self.tag, wire.nbytes, req, wire)

    def _post_chunks(self, src: int) -> None:
        self._parts = [self._post(self._host[a:b].numpy(), src) for a, b in self._pieces]

    def _poll(self) -> bool:
        if not self._header_done:
            if not self._header_req._poll():
                return False
            self._header_done = True
            self.peer = self._header_req.peer
            self._check_header(self.peer)
            if not self._parts:
                self._post_chunks(self.peer)
        while len(self._copies) < len(self._parts):  # MPI delivers one sender's chunks in order
            if not self._parts[len(self._copies)]._poll():
                return False
            a, b = self._pieces[len(self._copies)]
            self._copies.append(self._copier.copy(self._raw[a:b], self._host[a:b]))
        return all(c.ready() for c in self._copies)

    def _check_header(self, sender: int) -> None:
        sent = int(self._header[0])
        if sent != self.nbytes:
            raise MessageSizeError(
                f"rank {self.comm.rank} of group {self.comm.name} expected {self.nbytes} bytes "
                f"from rank {sender} (tag {self.tag}) but a {sent}-byte message is arriving "
                "(chunked, staged through host memory); sizes must match on both sides"
            )

    def _cancel(self) -> None:
        for part in [self._header_req, *self._parts]:
            part._cancel()

    def _finish(self) -> None:
        if self._pinned:
            self.comm._pinned().give(self._host)


def _host_buffer(comm, raw, pinned: bool):
    """The data's bytes on the host: pinned (reused) for a CUDA buffer, plain for a CPU tensor."""
    n = raw.numel()
    return comm._pinned().take(n) if pinned else raw.new_empty(n, device="cpu")
