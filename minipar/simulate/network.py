"""What a message costs on a simulated cluster: alpha + n beta on its link, and the ports it holds.

A message of n bytes from rank a to rank b, sent at virtual time t:

    inside a node    the NVLink (or PCIe) class: a's port out, b's port in
    across nodes     the network class: the NIC a's node gives a (local rank mod NICs) out,
                     the NIC b's node gives b in; ranks that share a NIC share its rate

    start   = the first time >= t at which both ports are free for n beta seconds
    arrival = start + n beta + alpha

A port carries one message at a time at its full rate: messages that want it at once take turns
(first come, first served, in the order the simulator meets them), so k messages at once take k
times as long as one, as k flows sharing the link fairly would all end (the last of them). alpha
(software, switch and wire latency) does not hold the port: back-to-back messages overlap it.
Each port keeps its busy intervals, so a message met later but sent earlier fills a gap before
a later one instead of queueing behind it.

A send completes when its bytes arrive (MPI's rendezvous), or, `pipelined`, when its last byte
has left the sender's port: NCCL keeps 8 slots of a step in flight on every connection
(NCCL_STEPS), so a rank starts its next step while the last one's latency is still on the wire.

`post`: seconds a message across nodes holds its sender's NIC port at least (NCCL's proxy
thread posts one chunk at a time, proxy.py); the message itself still arrives n beta + alpha
after it starts, so only the next message on that port waits.

`stream`: a message inside a node is cut through, as NCCL's LL and LL128 forward each line as
its flag lands (src/device/prims_ll128.h): the receiver may act on it from its first line,
start + line + alpha (`send`'s return), while its last byte lands at start + n beta + alpha
(`whole`, kept for the transport). A rank that forwards it moves the same bytes at the same
rate, so its message ends a line behind the one it forwards. Messages across nodes are whole:
NCCL's proxy posts a slot only once it is full (proxy.py). `wire` (seconds a byte, the
protocol's flags included): such a message lands at the NIC's pace, while its sender's port
stays held at the link's priced rate (the kernel's: the protocol's efficiency and NCCL's tree
correction), as with `post`: a slot waits for the wire once, the kernel's rate bounds the
stream of them.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

LINE = 128  # bytes: an LL128 line, what a streamed hop waits for before it forwards
PRUNE_EVERY = 1 << 14  # messages between two sweeps that drop intervals no message can reach


class Port:
    """The busy intervals [starts[i], ends[i]) of one port, sorted and disjoint, as C doubles:
    a ring lets its first ranks run about p steps ahead of its last (each waits only for its
    left neighbour), so up to p intervals a port wait for the laggards: p^2 in all, 16 bytes
    each here instead of 64 as Python floats in lists (1,024 ranks: about 1 M intervals)."""

    __slots__ = ("starts", "ends")

    def __init__(self):
        self.starts = array("d")
        self.ends = array("d")

    def earliest(self, t: float, d: float) -> float:
        """The first start >= t of a free stretch of d seconds."""
        ends = self.ends
        if not ends or t >= ends[-1]:
            return t
        starts = self.starts
        i = bisect_right(ends, t)
        while i < len(ends) and t + d > starts[i]:
            t = max(t, ends[i])
            i += 1
        return t

    def hold(self, start: float, end: float) -> None:
        starts, ends = self.starts, self.ends
        if not ends or start >= ends[-1]:  # the common case: after everything else
            if ends and start == ends[-1]:
                ends[-1] = end  # back to back: one interval
            else:
                starts.append(start)
                ends.append(end)
            return
        i = bisect_right(starts, start)
        starts.insert(i, start)
        ends.insert(i, end)

    def prune(self, horizon: float) -> None:
        """Forget intervals that end before `horizon` (no message can start before it)."""
        i = bisect_right(self.ends, horizon)
        if i:
            del self.starts[:i], self.ends[:i]


class Network:
    """The links of a cluster (cluster.py) and the busy ports, for one simulated world."""

    def __init__(
        self,
        cluster,
        size: int,
        contention=True,
        pipelined=False,
        post=0.0,
        stream=False,
        wire=None,
    ):
        self.cluster, self.size, self.contention = cluster, size, contention
        self.stream = stream  # messages inside a node cut through (LL, LL128)
        self.wire = wire  # seconds a byte across nodes, where not the link's beta
        self.whole = 0.0  # when the last message booked landed whole
        self.post = post  # seconds a cross-node message holds its NIC out at least
        self.pipelined = pipelined  # a send completes when it leaves its port, not on arrival
        self.departure = 0.0  # when the last message booked left its sender's port
        k = cluster.per_node
        self.node = [r // k for r in range(size)]
        self.nic = [(r % k) % cluster.nics for r in range(size)]
        self.ports: dict = {}
        # each rank's four ports, made on first use (ranks that share a NIC share its Port)
        self.outs, self.ins = [None] * size, [None] * size
        self.nic_outs, self.nic_ins = [None] * size, [None] * size
        self.messages = 0
        self.bytes = 0.0
        self.horizon = None  # a function: the smallest clock a future send may have
        self.next_prune = PRUNE_EVERY

    def send(self, src: int, dst: int, nbytes: float, t: float) -> float:
        """Book a message of nbytes from world rank src to dst, sent at t; its arrival time."""
        self.messages += 1
        self.bytes += nbytes
        inside = self.node[src] == self.node[dst]
        link = self.cluster.intra if inside else self.cluster.inter
        d = nbytes * link.beta
        if not self.contention or d == 0.0:
            if not inside and self.wire is not None:
                d = nbytes * self.wire
            self.departure = t + d
            self.whole = t + d + link.alpha
            return self._first(inside, t, d, link)
        held = d  # how long the sender's port is busy: the bytes, or the proxy's post
        if inside:
            out = self.outs[src] or self._mine(self.outs, src, ("out", src))
            into = self.ins[dst] or self._mine(self.ins, dst, ("in", dst))
        else:
            held = max(d, self.post)
            if self.wire is not None:  # the bytes land at the wire's pace
                d = nbytes * self.wire
            out = self.nic_outs[src] or self._mine(
                self.nic_outs, src, ("nic-out", self.node[src], self.nic[src])
            )
            into = self.nic_ins[dst] or self._mine(
                self.nic_ins, dst, ("nic-in", self.node[dst], self.nic[dst])
            )
        start = t
        while True:  # the first stretch free on both ports
            a = out.earliest(start, held)
            b = into.earliest(a, d)
            if a == b:
                break
            start = b
        out.hold(a, a + held)
        into.hold(a, a + d)
        if self.messages >= self.next_prune and self.horizon is not None:
            # a sweep costs a bisect a port: at most one every 4 messages a port
            self.next_prune = self.messages + max(PRUNE_EVERY, 4 * len(self.ports))
            horizon = self.horizon()
            for port in self.ports.values():
                port.prune(horizon)
        self.departure = a + d
        self.whole = a + d + link.alpha
        return self._first(inside, a, d, link)

    def _first(self, inside: bool, start: float, d: float, link) -> float:
        """When the receiver may act on a message that started at `start`: its first line if
        it streams (inside a node, `stream`), else its last byte."""
        if self.stream and inside:
            return start + min(d, LINE * link.beta) + link.alpha
        return start + d + link.alpha

    def _mine(self, table: list, rank: int, key) -> Port:
        table[rank] = port = self._port(key)
        return port

    def _port(self, key) -> Port:
        port = self.ports.get(key)
        if port is None:
            port = self.ports[key] = Port()
        return port
