"""One collective call in flight: its group, tag, algorithm and current step, and the messages.

An algorithm receives a `Call` and talks through it as through a communicator (`rank`, `size`,
`send`, `recv`, `sendrecv`, `isend`, `irecv`, `wait`), so a student's function written against a
communicator plugs in unchanged. The Call adds what the algorithm should not have to think about:
the call's own tag (collectives in flight never mix), the trace ledger, and timeouts that say
which collective, step and peer a rank was waiting for.

    for s in call.rounds(p - 1):   # each iteration is one step of the algorithm
        call.sendrecv(chunk_out, right, chunk_in, left)
"""

from __future__ import annotations

import functools

from minipar import buffers, ledger
from minipar.comm.base import wait_all


@functools.cache
def kind_of(collective: str, algorithm: str) -> int:
    """A number in [0, 256) for (collective, algorithm), part of every message's tag: ranks that
    disagree on which collective or algorithm they are in never match each other's messages, so
    they time out (naming the peer) instead of computing a wrong answer. It is the collective's
    row and the algorithm's column in registry.ALGORITHMS (15: a function passed directly)."""
    from minipar.collectives.registry import ALGORITHMS

    names = list(ALGORITHMS)
    row = names.index(collective) if collective in names else 15
    table = list(ALGORITHMS.get(collective, ()))
    column = table.index(algorithm) if algorithm in table else 15
    return 16 * (row % 16) + min(column, 15)


class Call:
    def __init__(self, comm, collective: str, algorithm: str):
        self.comm, self.collective, self.algorithm = comm, collective, algorithm
        self.rank, self.size = comm.rank, comm.size
        self.seq, self.tag = comm.next_collective_tag(kind_of(collective, algorithm))
        self.step = 0
        ledger.begin_call(comm, collective, algorithm, self.seq)

    def rounds(self, n: int):
        """Iterate n steps, numbering them after the steps this call already took."""
        first = self.step
        for i in range(n):
            self.step = first + i
            yield i
        self.step = first + n

    def _log(self, kind: str, peer: int, buf) -> None:
        if not ledger.active():
            return  # nothing records: skip the bookkeeping (it costs as much as a tiny message)
        ledger.record(
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
        self._log("recv", src, buf)
        return self.comm._post_recv(buf, src, self.tag)

    def context(self) -> str:
        """Where this rank is, for a timeout's message (built only if one happens)."""
        return (
            f"{self.collective} (algorithm {self.algorithm}) on group {self.comm.name}, "
            f"rank {self.rank}, step {self.step}"
        )

    def wait(self, requests) -> None:
        wait_all(requests, self.comm.timeout, self.context)

    def send(self, buf, dst: int) -> None:
        self.wait([self.isend(buf, dst)])

    def recv(self, buf, src: int) -> None:
        self.wait([self.irecv(buf, src)])

    def sendrecv(self, sendbuf, dst: int, recvbuf, src: int) -> None:
        self.wait([self.irecv(recvbuf, src), self.isend(sendbuf, dst)])
