"""Run a function on every rank of a simulated world: `simulate(fn, ranks, cluster)`.

    def step(rank):                            # the code a real rank runs
        x = np.full(1024, float(rank))
        minipar.all_reduce(x, algorithm="ring")
        return x
    run = simulate(step, ranks=64, cluster=preset("h100"))
    run.results[5], run.time, run.messages     # rank 5's answer, simulated seconds, messages

Inside `fn` the default group is the simulated world (process.world is the running rank's, the
scheduler swaps it at each handoff), so minipar's collectives, strategies and schedules run
unchanged; the world's node map (process.nodes) is the cluster's, per_node consecutive ranks a
node, so the two-level collectives find their nodes. The process's own minipar state (a real
world, its groups and node map, the fast-path switch) is put back afterwards: a simulation never
leaks into the real path. The fast paths are off inside (they are MPI's and shared memory's),
so every call takes the algorithm's own file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from minipar.runtime.nodes import NodeMap
from minipar.simulate.cluster import Cluster, check_count
from minipar.simulate.network import Network
from minipar.simulate.scheduler import Scheduler
from minipar.simulate.transport import SimCommunicator, SimGroup
from minipar.state import process


@dataclass
class Run:
    results: list  # fn's return value on each rank
    clocks: list  # each rank's simulated time at its end (seconds)
    messages: int
    bytes: float  # simulated bytes sent, all ranks together
    wall: float  # real seconds the simulation took
    switches: int  # baton handoffs between tasks

    @property
    def time(self) -> float:
        """Simulated seconds from the start to the last rank's end."""
        return max(self.clocks) if self.clocks else 0.0


class World:
    """What one simulated world shares: its network and how many bytes a real byte stands for."""

    def __init__(self, cluster: Cluster, size, scale, contention, pipelined, **network):
        self.cluster, self.size, self.scale = cluster, size, scale
        self.network = Network(cluster, size, contention, pipelined, **network)
        self.groups: dict = {}  # (world ranks, scale) -> SimGroup, for group() below


def simulate(
    fn,
    ranks: int,
    cluster: Cluster,
    scale=1.0,
    contention=True,
    pipelined=False,
    post=0.0,
    stream=False,
    wire=None,
) -> Run:
    """fn(rank) on `ranks` simulated ranks of `cluster`; the first error any rank raised is
    raised here (a deadlock names the ranks that waited). `pipelined`: a send completes when
    it leaves its port (NCCL's slots in flight, network.py), not when it arrives; `post`:
    seconds a message across nodes holds its NIC at least (NCCL's proxy, proxy.py); `stream`:
    messages inside a node cut through, line by line (NCCL's LL and LL128, network.py);
    `wire`: seconds a byte across nodes where not the link's (network.py)."""
    check_count(ranks, "ranks")
    if not scale > 0:
        raise ValueError(f"scale (simulated bytes per real byte) must be > 0, got {scale!r}")
    world = World(
        cluster, ranks, float(scale), contention, pipelined, post=post, stream=stream, wire=wire
    )
    scheduler = Scheduler()
    group = SimGroup(world, range(ranks), "w")
    saved = (process.world, dict(process.groups), process.fast_paths, process.debug, process.nodes)
    process.fast_paths, process.debug = False, False
    process.nodes = node_map(cluster, ranks)  # what the two-level collectives split groups by
    start = time.perf_counter()
    try:
        scheduler.tasks = []
        worlds = [SimCommunicator(group, r, None, "sim-world") for r in range(ranks)]
        world.network.horizon = lambda: min(
            (min(t.clock, t.floor) for t in scheduler.tasks if not t.done), default=0.0
        )
        tasks = scheduler.run(lambda r: _bind(worlds[r], scheduler, fn, r), ranks, worlds)
    finally:
        process.world, process.fast_paths, process.debug = saved[0], saved[2], saved[3]
        process.nodes = saved[4]
        process.groups.clear()
        process.groups.update(saved[1])
    wall = time.perf_counter() - start
    errors = [t.error for t in tasks if t.error is not None]
    first = [e for e in errors if not _from_deadlock(e, tasks)]
    if errors:
        raise (first or errors)[0]
    return Run(
        [t.result for t in tasks],
        [t.clock for t in tasks],
        world.network.messages,
        world.network.bytes,
        wall,
        scheduler.switches,
    )


def node_map(cluster: Cluster, size: int) -> NodeMap:
    """The simulated world's nodes: consecutive ranks, cluster.per_node a node."""
    k = cluster.per_node
    names = tuple(f"simulated-node-{i}" for i in range(-(-size // k)))
    return NodeMap(tuple(r // k for r in range(size)), names, "a simulated cluster")


def _bind(comm, scheduler, fn, rank):
    comm.task = scheduler.tasks[rank]
    return fn(rank)


def _from_deadlock(error, tasks) -> bool:
    return any(t.dead and t.error is error for t in tasks)


def concurrently(thunks) -> None:
    """Run each thunk on this rank as if at the same time: each starts at the clock of now,
    and the rank's clock ends at the latest end. The ports they share still carry one message
    at a time (network.py fills their gaps). Only inside a simulated rank."""
    task = getattr(process.world, "task", None)
    if task is None:
        raise RuntimeError("concurrently() runs only inside a simulated rank (simulate())")
    start, end = task.clock, task.clock
    task.floor = min(task.floor, start)  # what the network's pruning may not pass meanwhile
    try:
        for thunk in thunks:
            task.clock = start
            thunk()
            end = max(end, task.clock)
    finally:
        task.floor = float("inf")
    task.clock = end


def group(ranks, scale: float | None = None):
    """This rank's communicator on the simulated group of world `ranks` (in that order), with
    no meeting: unlike new_group, only the members call it, each once. `scale`: simulated
    bytes per real byte on this group (default: the world's), so a step's activations and its
    gradients may each stand for their own sizes."""
    comm = process.world
    task = getattr(comm, "task", None)
    if task is None:
        raise RuntimeError("group() runs only inside a simulated rank (simulate())")
    ranks = tuple(ranks)
    world = comm.group.world
    key = (ranks, scale)
    shared = world.groups.get(key)
    if shared is None:
        shared = world.groups[key] = SimGroup(world, ranks, f"w.{len(world.groups) + 1}", scale)
    label = f"group{list(ranks)}" if len(ranks) <= 8 else f"group of {len(ranks)}"
    return SimCommunicator(shared, ranks.index(comm.world_rank), task, label)
