"""The simulated transport: the Communicator interface (comm/transport/base.py) over virtual time.

The collectives call `_post_send` / `_post_recv` and wait, as on MPI; here a send copies its
bytes at once (eager, as MPI does with small messages), books them on the network (network.py:
arrival = start + n beta + alpha) and hands them to the matching receive, matched as MPI does:
by sender, tag and order. Waiting on a request moves the rank's clock to the time it completed
(a send: when its bytes arrived; a receive: the later of its posting and the arrival), and a
receive whose message nobody sent yet puts the rank to sleep (scheduler.py).

`scale` bytes of the simulated cluster stand for each real byte: a 1 GiB all-reduce on 1,024
ranks runs on a few kilobytes of real data and is priced as 1 GiB.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from minipar.comm.transport import buffers
from minipar.comm.transport.base import Communicator, NonMember, Request, TagLayout, check_ranks
from minipar.errors import MiniparError

SIM_TIMEOUT = 1e9  # virtual waits never time out; a deadlock is found by the scheduler instead
# messages a sender may queue for a receiver that has not asked for them before it hands the
# baton on: a ring's first ranks would otherwise run ~p steps ahead of its last, p^2 queued
# copies in all (4,096 ranks: 17 million). Clocks do not depend on the order tasks run in.
RUN_AHEAD = 64


class SimGroup:
    """What the members of one simulated group share: who is in it, the messages in flight."""

    def __init__(self, world, global_ranks, gid: str, scale: float | None = None):
        self.world, self.global_ranks, self.gid = world, list(global_ranks), gid
        self.scale = world.scale if scale is None else scale  # simulated bytes per real byte
        self.size = len(self.global_ranks)
        self.unexpected: dict = {}  # (src, dst, tag) -> (data, arrival, whole)s not yet received
        self.posted: dict = {}  # (src, dst, tag) -> deque of receives waiting for a message
        self.splits: dict = {}  # child gid -> what the members met with (split)
        self.members: list = [None] * self.size  # each rank's SimCommunicator
        self.tags = TagLayout(Communicator.tag_ub)


class SimRequest(Request):
    """A send (complete at once, its bytes arrive at `arrival`) or a receive (complete when
    its message came)."""

    def __init__(self, comm, kind, peer, tag, nbytes, buf=None, arrival=None):
        # Request.__init__'s fields, set here: one of these is made for every message
        self.comm, self.kind, self.peer, self.tag, self.nbytes = comm, kind, peer, tag, nbytes
        self.done = False
        self.buf, self.arrival = buf, arrival
        self.whole = arrival  # a receive: when its last byte landed (later if it streamed)
        self.posted_at = comm.task.clock if comm.task is not None else 0.0

    blocking = True  # wait_all calls _block: the task sleeps instead of polling

    def done_real(self) -> bool:
        return self.arrival is not None

    def _poll(self) -> bool:
        if self.arrival is None:
            return False
        task = self.comm.task
        if self.arrival > task.clock:
            task.clock = self.arrival
        return True

    def _block(self, seconds: float) -> bool:
        self.comm.task.block(self)
        return self._poll()

    def deliver(self, data, arrival: float, whole: float | None = None) -> None:
        buf = self.buf
        if type(buf) is np.ndarray and type(data) is np.ndarray and buf.nbytes == data.nbytes:
            np.copyto(buf, data)  # the common case, on every message
        else:
            self._deliver_other(data)
        self.arrival = max(arrival, self.posted_at)
        self.whole = max(arrival if whole is None else whole, self.arrival)
        task = self.comm.task
        if task.waiting is self:
            task.scheduler.wake(task)

    def _deliver_other(self, data) -> None:
        if buffers.nbytes(self.buf) != buffers.nbytes(data):
            raise MiniparError(
                f"message of {buffers.nbytes(data)} bytes from rank {self.peer} does not fit "
                f"the receive of {buffers.nbytes(self.buf)} bytes on group {self.comm.name}"
            )
        buffers.copy_(self.buf, data)


class SimCommunicator(Communicator):
    """One rank's view of a simulated group."""

    backend = "sim"

    def __init__(self, group: SimGroup, rank: int, task, name: str):
        # Communicator.__init__'s fields, less two that cost O(p) per rank (O(p^2) a world):
        # the members share one list of global ranks, and no rank keeps a table of its recent
        # calls (what the watchdog compares; nothing here disagrees by accident)
        self.rank, self.size, self.name, self.timeout = rank, group.size, name, SIM_TIMEOUT
        self.global_ranks = group.global_ranks
        self.gid, self._splits, self._seq, self._history = group.gid, 0, 0, 0
        self._tags = group.tags
        self._tag_base, self._hash_bits = self._tags.base, self._tags.hash_bits
        self._hash_mask = self._tags.hash_mask
        self._calls = _NO_HISTORY
        self._failure, self._told = None, False
        self._meetings = 0
        self.group, self.task = group, task
        self.world_rank = group.global_ranks[rank]
        group.members[rank] = self

    def _post_send(self, buf, dst: int, tag: int) -> Request:
        group = self.group
        if type(buf) is np.ndarray:
            data, nbytes = buf.copy(), buf.nbytes
        else:
            data, nbytes = _copy(buf), buffers.nbytes(buf)
        world = group.world
        network = world.network
        arrival = network.send(
            self.world_rank, group.global_ranks[dst], nbytes * group.scale, self.task.clock
        )
        done = network.departure if network.pipelined else network.whole  # before others send
        key = (self.rank, dst, tag)
        waiting = group.posted.get(key)
        if waiting:
            waiting.popleft().deliver(data, arrival, network.whole)
        else:
            queue = group.unexpected.setdefault(key, deque())
            queue.append((data, arrival, network.whole))
            if len(queue) > RUN_AHEAD:  # the receiver lags: let it catch up (memory)
                self.task.scheduler.pause(self.task)
        return SimRequest(self, "send", dst, tag, nbytes, arrival=done)

    def _post_recv(self, buf, src: int, tag: int) -> Request:
        group = self.group
        request = SimRequest(self, "recv", src, tag, buffers.nbytes(buf), buf)
        key = (src, self.rank, tag)
        queue = group.unexpected.get(key)
        if queue:
            request.deliver(*queue.popleft())
        else:
            group.posted.setdefault(key, deque()).append(request)
        return request

    def _post_recv_any(self, buf, tag: int) -> Request:
        raise MiniparError("a receive from any source is not simulated; name the sender")

    def _post_barrier(self) -> Request:
        raise MiniparError("the transport's barrier is not simulated; use minipar.barrier()")

    def allgather_object(self, obj, context: str = "") -> list:
        self._meetings += 1  # every member counts its object all-gathers alike
        return self._meet(("objects", self._meetings), obj)

    def split(self, ranks, name: str | None = None):
        """Every member calls it with the same ranks (group ranks of this group)."""
        ranks = check_ranks(ranks, self.size)
        gid = self.child_gid()
        met = self._meet(("split", gid), tuple(ranks))
        if any(m != met[0] for m in met):
            raise MiniparError(f"ranks of group {self.name} split with different rank lists")
        group = self.group
        child = group.splits.get(gid)
        if child is None:
            child = group.splits[gid] = SimGroup(
                group.world, [group.global_ranks[r] for r in ranks], gid
            )
        if self.rank not in ranks:
            return NonMember([group.global_ranks[r] for r in ranks], self.world_rank)
        label = name or f"group{[group.global_ranks[r] for r in ranks]}"
        return SimCommunicator(child, ranks.index(self.rank), self.task, label)

    def _meet(self, key, value) -> list:
        """Control plane: every member's value, in rank order (costs no simulated time)."""
        table = self.group.splits.setdefault(key, {"values": {}, "waiting": []})
        table["values"][self.rank] = value
        if len(table["values"]) < self.size:
            wait = _Meeting(self, table)
            table["waiting"].append(self.task)
            self.task.block(wait)
        else:
            for task in table["waiting"]:
                task.scheduler.wake(task)
        return [table["values"][r] for r in range(self.size)]

    def abort(self, code: int = 1) -> None:
        raise MiniparError(f"rank {self.world_rank} of a simulated world aborted (code {code})")


class _NoHistory:
    """The table of recent calls, kept by no simulated rank: writes vanish, reads find none."""

    def __setitem__(self, key, value) -> None:
        pass

    def __getitem__(self, key):
        return None


_NO_HISTORY = _NoHistory()


class _Meeting:
    """What a rank waits on in `_meet`: every member's value."""

    def __init__(self, comm, table):
        self.comm, self.table = comm, table

    def done_real(self) -> bool:
        return len(self.table["values"]) == self.comm.size

    def describe(self) -> str:
        return f"the other ranks of group {self.comm.name} (a split or an object all-gather)"


def _copy(buf):
    if isinstance(buf, np.ndarray):
        return buf.copy()
    return buf.detach().clone()
