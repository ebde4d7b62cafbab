"""Which node each rank runs on: the world's node map, and the groups inside and across nodes.

    minipar.node_rank()          # this rank's node: 0 .. num_nodes()-1 (torchrun's GROUP_RANK)
    minipar.num_nodes()          # how many nodes the world spans
    minipar.local_rank()         # this rank's index on its node (LOCAL_RANK)
    minipar.local_world_size()   # ranks on this rank's node (LOCAL_WORLD_SIZE)
    minipar.node_map(group)      # the node of each rank of a group, in group-rank order

A node is what the MPI library calls one: the ranks that share memory, MPI_Comm_split_type(
MPI_COMM_TYPE_SHARED), which follows the launcher's hosts (each host of `mpiexec -hosts a:2,b:2`
is a node; so is each emulated node of `minipar run --nodes`, each with its own hostname). Under
torchrun the node is torchrun's GROUP_RANK; with neither, the host name. Nodes are numbered by
their lowest world rank, so with consecutive ranks on a node (how every launcher fills nodes)
node i holds ranks i*k .. i*k+k-1.

The map is found once, in init(): one small all-gather of each rank's node key. It is what the
two-level collectives split a group by (`node_groups`), what the mesh reads to say which axes
stay inside a node, and what `minipar doctor` prints.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from minipar.cost import links
from minipar.errors import NotInitializedError
from minipar.state import process


@dataclass(frozen=True)
class NodeMap:
    """The node of every world rank, and each node's host name."""

    node_of: tuple[int, ...]  # world rank -> node index
    names: tuple[str, ...]  # node index -> host name
    source: str  # what said which ranks share a node

    @property
    def n_nodes(self) -> int:
        return len(self.names)

    def ranks_on(self, node: int) -> list[int]:
        return [r for r, n in enumerate(self.node_of) if n == node]

    def of_group(self, global_ranks) -> list[int]:
        """The node of each rank of a group (its world ranks, in group-rank order)."""
        return [self.node_of[g] for g in global_ranks]

    def by_node(self, global_ranks) -> list[list[int]]:
        """A group's ranks (group numbering) by node, nodes in the order of their first rank."""
        owner = self.of_group(global_ranks)
        return [[r for r, n in enumerate(owner) if n == node] for node in dict.fromkeys(owner)]

    def local_rank(self, rank: int) -> int:
        return self.ranks_on(self.node_of[rank]).index(rank)

    def local_size(self, rank: int) -> int:
        return self.node_of.count(self.node_of[rank])


def from_keys(keys, source: str) -> NodeMap:
    """The map from each rank's (node key, host name): ranks with equal keys share a node;
    nodes are numbered in the order their first rank appears."""
    index: dict = {}
    names: list[str] = []
    node_of = []
    for key, host in keys:
        if key not in index:
            index[key] = len(names)
            names.append(host)
        node_of.append(index[key])
    return NodeMap(tuple(node_of), tuple(names), source)


def remember(comm) -> None:
    """Called by init(): every rank sends its node key, all ranks build the same map. The link
    `auto` prices with rides along: `auto` decides on each rank alone, so ranks that price
    differently (a calibration file of each host's own, one just turned stale) would pick
    different algorithms and wait for each other forever; where they differ, rank 0's holds.
    So does the link between nodes (a MINIPAR_INTER_LINK file one host lacks): across nodes
    `auto` prices on both."""
    key, source = _node_key(comm)
    priced = (links.default_link(), links.inter_link())
    keys = comm.allgather_object((key, socket.gethostname(), priced), "finding the node map")
    process.nodes = from_keys([k[:2] for k in keys], source)
    if any(k[2][0] != keys[0][2][0] for k in keys):
        links.set_default_link(keys[0][2][0])
    if any(k[2][1] != keys[0][2][1] for k in keys):
        links.set_inter_link(keys[0][2][1])


def forget() -> None:
    process.nodes = None


def _node_key(comm):
    mpi_comm = getattr(comm, "mpi", None)
    if mpi_comm is not None:
        from mpi4py import MPI

        node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, comm.rank)
        try:  # the node's lowest world rank names it
            low = node.allreduce(comm.rank, op=MPI.MIN)
            return low, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)"
        finally:
            node.Free()
    if os.environ.get("GROUP_RANK", "") != "":
        return ("torchrun", int(os.environ["GROUP_RANK"])), "GROUP_RANK (torchrun)"
    return socket.gethostname(), "the host name"


def nodes() -> NodeMap:
    """The world's node map (init() must have run)."""
    if process.nodes is None:
        if process.world is None:
            raise NotInitializedError()
        remember(process.world)
    return process.nodes


def _group(group):
    """The default group for None (world.py resolves and checks groups; it imports this file)."""
    if group is None:
        nodes()
        return process.world
    return group


def _world_rank() -> int:
    return process.world.global_ranks[process.world.rank]


def node_rank() -> int:
    """This rank's node, 0 .. num_nodes()-1 (torchrun calls it GROUP_RANK)."""
    return nodes().node_of[_world_rank()]


def num_nodes() -> int:
    """How many nodes the world spans."""
    return nodes().n_nodes


def local_world_size() -> int:
    """How many ranks run on this rank's node (torchrun's LOCAL_WORLD_SIZE)."""
    return nodes().local_size(_world_rank())


def node_map(group=None) -> list[int]:
    """The node of each rank of `group` (default: the world), in group-rank order."""
    return nodes().of_group(_group(group).global_ranks)


@dataclass
class NodeGroups:
    """A group cut by node: `intra` holds this rank's peers on its node, `uniform` says every
    node holds the same number of the group's ranks (what the two-level algorithms need)."""

    intra: object
    n_nodes: int
    uniform: bool


def node_groups(group=None) -> NodeGroups:
    """The group cut by node (cached on the group). Every rank of the group calls it: it makes
    one sub-group per node, each a split of the group."""
    comm = _group(group)
    cached = getattr(comm, "_node_groups", None)
    if cached is not None:
        return cached
    members = nodes().by_node(comm.global_ranks)
    intra = None
    for k, ranks in enumerate(members):
        made = comm.split(ranks, f"{comm.name}:node{k}")
        if comm.rank in ranks:
            intra = made
    found = NodeGroups(intra, len(members), len({len(m) for m in members}) == 1)
    comm._node_groups = found
    return found
