"""Point-to-point with torch.distributed's names: send, recv, isend, irecv, P2POp,
batch_isend_irecv, all on minipar's own transport.

    req = minipar.isend(x, dst=1)           # a Work: req.wait(), req.is_completed()
    sender = minipar.recv(y)                # src=None: from whichever rank sends first
    reqs = minipar.batch_isend_irecv([minipar.P2POp(minipar.isend, x, right),
                                      minipar.P2POp(minipar.irecv, y, left)])

What moves: the tensor's bytes, as one message from one rank to another; nothing else (no
header, no handshake), so sender and receiver must agree on the size (a mismatch raises
MessageSizeError, or gloo aborts). Each message is in the trace ledger as collective "p2p".

Ranks follow torch.distributed here, which is NOT minipar's convention for the tensor
collectives: `dst` / `src` / `peer` are *global* ranks (the world's numbering, whatever `group`
is), and `group_dst` / `group_src` / `group_peer` are ranks in `group`; pass one of the two.
`recv` returns the sender's global rank. Tags are ints in [0, 32768): minipar keeps the tags
above for its collectives. Like torch, blocking send/recv refuse the calling rank as peer,
isend/irecv accept it. Every argument is checked before any message is posted.
"""

from __future__ import annotations

import datetime

from minipar import runtime
from minipar.collectives.work import Work
from minipar.comm.trace import ledger
from minipar.comm.transport import buffers
from minipar.comm.transport.base import abandon, wait_all


class P2PWork(Work):
    """The Work of isend/irecv: the transport's requests, polled by is_completed(), awaited
    (within the group's timeout) by wait()."""

    def __init__(self, requests, comm, description: str):
        super().__init__(description)
        self._requests, self._comm = list(requests), comm

    def is_completed(self) -> bool:
        if not self._done.is_set():
            try:
                if all(r.test() for r in self._requests):
                    self._finish()
            except BaseException as error:  # kept for wait() to raise
                abandon(self._requests)
                self._finish(error)
        return self._done.is_set()

    def wait(self, timeout=None) -> bool:
        if not self._done.is_set():
            seconds = seconds_of(timeout) or self._comm.timeout
            try:
                wait_all(self._requests, seconds, self.description)
            except BaseException as error:
                self._finish(error)
                raise
            self._finish()
        if self._error is not None:
            raise self._error
        return True

    def _source_rank(self) -> int:
        """The sender's rank in the group (torch's name; meaningful once a receive is done)."""
        return self._requests[0].peer


def seconds_of(timeout) -> float | None:
    """torch passes timeouts as datetime.timedelta; minipar takes seconds too."""
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return timeout


def _is_rank(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def group_rank_of(comm, rank, group_rank, what: str, default=None) -> int:
    """torch's rule: `what` is a global rank, `group_<what>` a rank in the group, exactly one
    of them (or `default`, a global rank, when both are None). Returns the group rank."""
    named = f"group_{what}"
    if rank is not None and group_rank is not None:
        raise ValueError(
            f"pass {what} (a global rank) or {named} (a rank in the group), not both: "
            f"got {what}={rank!r}, {named}={group_rank!r}"
        )
    if rank is None and group_rank is None:
        if default is None:
            raise ValueError(f"{what} is missing: pass {what} (a global rank) or {named}")
        rank = default
    if group_rank is not None:
        if not _is_rank(group_rank) or not 0 <= group_rank < comm.size:
            raise ValueError(
                f"{named}={group_rank!r} is not a rank of group {comm.name} (group size "
                f"{comm.size}; valid: 0..{comm.size - 1})"
            )
        return group_rank
    if not _is_rank(rank) or rank not in comm.global_ranks:
        raise ValueError(
            f"{what}={rank!r} is not a global rank in group {comm.name} (its global ranks: "
            f"{comm.global_ranks}; {named}= takes a rank in the group)"
        )
    return comm.global_ranks.index(rank)


def _checked(tensor, group, tag, writable: bool):
    comm = runtime.resolve(group)
    buffers.check(tensor, "tensor", writable=writable)
    comm._check_tag(tag)
    return comm, buffers.flat(tensor)  # detached: a tensor that requires grad is fine


def _not_self(comm, peer: int, what: str) -> None:
    if peer == comm.rank:
        raise ValueError(
            f"invalid {what} rank: it is the calling rank itself, which a blocking send/recv "
            "cannot talk to (isend/irecv can)"
        )


def _post_send(comm, x, peer: int, tag: int) -> P2PWork:
    request = comm.isend(x, peer, tag)  # records the message in the ledger
    where = f"send to rank {comm.global_ranks[peer]} (tag {tag}) on group {comm.name}"
    return P2PWork([request], comm, where)


def _post_recv(comm, x, peer, tag: int) -> P2PWork:
    if peer is None:
        message = ledger.record(comm, "p2p", "p2p", -1, 0, "recv", -1, buffers.nbytes(x), tag)
        request = comm._post_recv_any(x, tag)
        if message is not None:
            request.traced = message.clock
        where = f"recv from any rank (tag {tag}) on group {comm.name}"
    else:
        request = comm.irecv(x, peer, tag)
        where = f"recv from rank {comm.global_ranks[peer]} (tag {tag}) on group {comm.name}"
    return P2PWork([request], comm, where)


def isend(tensor, dst=None, group=None, tag: int = 0, group_dst=None) -> Work:
    """Start sending `tensor` to global rank `dst` (or group rank `group_dst`); returns a Work."""
    if group is not None and runtime.outside(group, "isend"):
        return None
    comm, x = _checked(tensor, group, tag, writable=False)
    peer = group_rank_of(comm, dst, group_dst, "dst")
    return _post_send(comm, x, peer, tag)


def irecv(tensor, src=None, group=None, tag: int = 0, group_src=None) -> Work:
    """Start receiving into `tensor` from global rank `src` (or group rank `group_src`; both
    None: from any rank). Returns a Work."""
    if group is not None and runtime.outside(group, "irecv"):
        return None
    comm, x = _checked(tensor, group, tag, writable=True)
    peer = None
    if src is not None or group_src is not None:
        peer = group_rank_of(comm, src, group_src, "src")
    return _post_recv(comm, x, peer, tag)


def send(tensor, dst=None, group=None, tag: int = 0, group_dst=None) -> None:
    """Send `tensor` to global rank `dst` (or group rank `group_dst`) and wait until it left."""
    if group is not None and runtime.outside(group, "send"):
        return None
    comm, x = _checked(tensor, group, tag, writable=False)
    peer = group_rank_of(comm, dst, group_dst, "dst")
    _not_self(comm, peer, "destination")
    _post_send(comm, x, peer, tag).wait()


def recv(tensor, src=None, group=None, tag: int = 0, group_src=None) -> int:
    """Receive into `tensor` from global rank `src` (or group rank `group_src`; both None: from
    any other rank). Returns the sender's global rank."""
    if group is not None and runtime.outside(group, "recv"):
        return -1
    comm, x = _checked(tensor, group, tag, writable=True)
    peer = None
    if src is not None or group_src is not None:
        peer = group_rank_of(comm, src, group_src, "src")
        _not_self(comm, peer, "source")
    work = _post_recv(comm, x, peer, tag)
    work.wait()
    return comm.global_ranks[work._source_rank()]


class P2POp:
    """One send or receive of a batch: `op` is minipar.isend or minipar.irecv, `peer` a global
    rank (or `group_peer` a rank in `group`). Checked when built, posted by batch_isend_irecv."""

    def __init__(self, op, tensor, peer=None, group=None, tag: int = 0, group_peer=None):
        if op is not isend and op is not irecv:
            name = getattr(op, "__qualname__", type(op).__qualname__)
            raise ValueError(
                "P2POp's op must be minipar.isend or minipar.irecv, got "
                f"{getattr(op, '__module__', None)}.{name}"
            )
        self.op, self.tensor, self.tag = op, tensor, tag
        self.group, _ = _checked(tensor, group, tag, writable=op is irecv)
        self.group_peer = group_rank_of(self.group, peer, group_peer, "peer")
        self.peer = self.group.global_ranks[self.group_peer]

    def __repr__(self) -> str:
        return (
            f"P2POp({self.op.__name__}, peer={self.peer}, group={self.group.name}, "
            f"tag={self.tag}, {buffers.describe(self.tensor)})"
        )


def batch_isend_irecv(p2p_op_list) -> list:
    """Post every send and receive of the list at once; one Work per op, in the list's order.

    All are posted before any is awaited, so the order of sends and receives in the list cannot
    deadlock; two messages between the same pair in the same direction match in list order.
    """
    if (
        not isinstance(p2p_op_list, list)
        or not p2p_op_list
        or not all(isinstance(op, P2POp) for op in p2p_op_list)
    ):
        raise ValueError(
            "batch_isend_irecv takes a non-empty list of minipar.P2POp, got "
            f"{type(p2p_op_list).__name__} {p2p_op_list!r}"[:200]
        )
    group = p2p_op_list[0].group
    if not all(op.group is group for op in p2p_op_list):
        raise ValueError("batch_isend_irecv: all ops must use the same group")
    works = []
    for op in p2p_op_list:
        x = buffers.flat(op.tensor)
        if op.op is isend:
            works.append(_post_send(group, x, op.group_peer, op.tag))
        else:
            works.append(_post_recv(group, x, op.group_peer, op.tag))
    return works
