"""The MPI transport's requests for a pipelined staged message (see comm/staging.py): one
logical send or receive made of k chunk messages, each a plain MPIRequest with its size check.

The first chunk carries an 8-byte header, the whole message's size: chunk sizes alone cannot
tell a 2-chunk receive from the first two chunks of a 3-chunk send, the header can (and a plain,
unchunked receive on the other end sees a message too large for it, so it fails too)."""

from __future__ import annotations

import numpy as np

from minipar import buffers, ledger
from minipar.comm import staging
from minipar.comm.base import Request
from minipar.comm.mpi import MPIAnySourceRequest, MPIRequest, _mpi
from minipar.errors import MessageSizeError

HEADER = 8  # bytes: the message's total size, as int64, before the first chunk's data


class PipelinedSend(Request):
    """Chunk i goes to MPI as soon as its device -> host copy has finished."""

    def __init__(self, comm, buf, dst: int, tag: int):
        nbytes = buffers.nbytes(buf)
        super().__init__(comm, "send", dst, tag, nbytes)
        raw = buffers.byte_view(buf)
        self._pinned = buffers.is_cuda(buf)  # else a CPU tensor under MINIPAR_STAGE_HOST
        self._host = _host_buffer(comm, raw, self._pinned)
        self._host[:HEADER].numpy().view(np.int64)[0] = nbytes
        self._pieces = staging.bounds(nbytes, comm._chunk)
        copier = staging.Copier(buf)
        data = self._host[HEADER:]
        self._copies = [copier.copy(data[a:b], raw[a:b]) for a, b in self._pieces]
        self._raw = raw  # the copies still read it: keep it alive until they are done
        self._parts: list = []  # the chunk sends posted so far
        self._open: list = []  # those not yet complete
        ledger.note_path(comm, "send", dst, nbytes, "staged-pipelined")

    def _poll(self) -> bool:
        while len(self._parts) < len(self._pieces) and self._copies[len(self._parts)].ready():
            wire = _wire(self._host, self._pieces, len(self._parts))
            req = self.comm.mpi.Isend([wire, _mpi().BYTE], self.peer, self.tag)
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
        self._parts = [None] * len(self._pieces)
        self._copies: list = []
        self._any = src is None
        self._post(0, src)
        if src is not None:
            for i in range(1, len(self._pieces)):
                self._post(i, src)
        ledger.note_path(comm, "recv", self.peer, nbytes, "staged-pipelined")

    def _post(self, i: int, src) -> None:
        wire = _wire(self._host, self._pieces, i)
        MPI = _mpi()
        peer = MPI.ANY_SOURCE if src is None else src
        req = self.comm.mpi.Irecv([wire, MPI.BYTE], peer, self.tag)
        kind = MPIAnySourceRequest if src is None else MPIRequest
        self._parts[i] = kind(self.comm, "recv", -1 if src is None else src, self.tag, wire.size,
                              req, wire)  # fmt: skip

    def _poll(self) -> bool:
        for i, part in enumerate(self._parts):
            if part is None or i < len(self._copies):
                continue  # not posted yet, or landed and its copy queued
            if i != len(self._copies) or not part._poll():
                break  # MPI delivers one sender's chunks in order
            a, b = self._pieces[i]
            if i == 0:
                self._check_header(part.peer)
            data = self._host[HEADER:]
            self._copies.append(self._copier.copy(self._raw[a:b], data[a:b]))
            if i == 0 and self._any:  # the sender is known now: the rest come from it
                self.peer = part.peer
                for j in range(1, len(self._pieces)):
                    self._post(j, self.peer)
        if len(self._copies) < len(self._pieces):
            return False
        return all(c.ready() for c in self._copies)

    def _check_header(self, sender: int) -> None:
        sent = int(self._host[:HEADER].numpy().view(np.int64)[0])
        if sent != self.nbytes:
            raise MessageSizeError(
                f"rank {self.comm.rank} of group {self.comm.name} expected {self.nbytes} bytes "
                f"from rank {sender} (tag {self.tag}) but a {sent}-byte message is arriving "
                "(chunked, staged through host memory); sizes must match on both sides"
            )

    def _cancel(self) -> None:
        for part in self._parts:
            if part is not None:
                part._cancel()

    def _finish(self) -> None:
        if self._pinned:
            self.comm._pinned().give(self._host)


def _host_buffer(comm, raw, pinned: bool):
    """Header + data bytes: pinned (reused) for a CUDA buffer, plain for a CPU test tensor."""
    n = HEADER + raw.numel()
    return comm._pinned().take(n) if pinned else raw.new_empty(n, device="cpu")


def _wire(host, pieces, i: int):
    """The bytes of chunk i as MPI sees them (chunk 0 with the header in front)."""
    a, b = pieces[i]
    return host[(0 if i == 0 else HEADER + a) : HEADER + b].numpy()
