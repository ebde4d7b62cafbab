"""One collective call in flight: its group, tag, algorithm and current step, and the messages.

An algorithm receives a `Call` and talks through it as through a communicator (`rank`, `size`,
`send`, `recv`, `sendrecv`, `isend`, `irecv`, `wait`), so a student's function written against a
communicator plugs in unchanged. The Call adds what the algorithm should not have to think about:
the call's own tag (collectives in flight never mix, and neither do ranks that disagree about the
call: the tag carries a hash of its signature), the trace ledger, and timeouts that say which
collective, step and peer a rank was waiting for.

    for s in call.rounds(p - 1):   # each iteration is one step of the algorithm
        call.sendrecv(chunk_out, right, chunk_in, left)
"""

from __future__ import annotations

import numpy as np

from minipar.collectives import fast
from minipar.collectives.fast.direct import exchange
from minipar.comm.trace import ledger
from minipar.comm.transport import buffers
from minipar.comm.transport.base import wait_all
from minipar.errors import CommTimeoutError
from minipar.state import process


class Call:
    def __init__(self, comm, collective: str, algorithm: str, sig=None):
        """`sig`: the call's signature (comm/trace/signature.py), folded into its tag; by default
        the (collective, algorithm) pair alone."""
        self.comm, self.collective, self.algorithm = comm, collective, algorithm
        self.rank, self.size = comm.rank, comm.size
        if sig is None:
            sig = (collective, algorithm, None, None, None, None, None)
        self.seq, self.tag = comm.next_collective_tag(sig)
        self.step = 0
        self._direct = fast.direct_steps(comm)  # numpy steps may take fast/direct.py's exchange
        ledger.begin_call(comm, collective, algorithm, self.seq)

    def rounds(self, n: int):
        """Iterate n steps, numbering them after the steps this call already took."""
        first = self.step
        for i in range(n):
            self.step = first + i
            yield i
        self.step = first + n

    def _log(self, kind: str, peer: int, buf):
        if not process.traces:
            return None  # nothing records: skip the bookkeeping (it costs as a tiny message)
        return ledger.record(
            self.comm,
            self.collective,
            self.algorithm,
            self.seq,
            self.step,
            kind,
            peer,
            buffers.nbytes(buf),
        )

    def isend(self, buf, dst: int):
        self._log("send", dst, buf)
        return self.comm._post_send(buf, dst, self.tag)

    def irecv(self, buf, src: int):
        message = self._log("recv", src, buf)
        request = self.comm._post_recv(buf, src, self.tag)
        if message is not None:
            request.traced = message.clock  # the ledger notes when it completes
        return request

    def context(self) -> str:
        """Where this rank is, for a timeout's message (built only if one happens)."""
        return self._where(self.step)

    def wait(self, requests) -> None:
        try:
            wait_all(requests, self.comm.timeout, self.context)
        except CommTimeoutError as error:  # the transport may find out why (torch: the store)
            raise self.comm.explain_timeout(self, error) from None

    def send(self, buf, dst: int) -> None:
        if self._direct and type(buf) is np.ndarray and not process.traces:
            return self._exchange(buf, dst, None, None)  # the fast path: fast/direct.py
        self.wait([self.isend(buf, dst)])

    def recv(self, buf, src: int) -> None:
        if self._direct and type(buf) is np.ndarray and not process.traces:
            return self._exchange(None, None, buf, src)  # the fast path: fast/direct.py
        self.wait([self.irecv(buf, src)])

    def sendrecv(self, sendbuf, dst: int, recvbuf, src: int) -> None:
        if (
            self._direct
            and type(sendbuf) is np.ndarray
            and type(recvbuf) is np.ndarray
            and not process.traces
        ):
            return self._exchange(sendbuf, dst, recvbuf, src)  # the fast path: fast/direct.py
        self.wait([self.irecv(recvbuf, src), self.isend(sendbuf, dst)])

    def _exchange(self, sendbuf, dst, recvbuf, src) -> None:
        """The fast path for numpy buffers on an MPI group, nothing recording: mpi4py's own
        requests, polled a little before the general wait (collectives/fast/direct.py); the
        same messages as isend/irecv."""
        try:
            exchange(self.comm, sendbuf, dst, recvbuf, src, self.tag, self._where, self.step)
        except CommTimeoutError as error:
            raise self.comm.explain_timeout(self, error) from None

    def _where(self, step: int) -> str:
        return (
            f"{self.collective} (algorithm {self.algorithm}) on group {self.comm.name}, "
            f"rank {self.rank}, step {step}"
        )
