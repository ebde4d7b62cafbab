"""The device mesh: a group's ranks laid on a (pp, dp, cp, tp) grid, one sub-group per line of
it, and the expert-parallel groups laid over dp.

    mesh = DeviceMesh(dp=2, tp=2, pp=2)              # 8 ranks
    mesh = DeviceMesh(dp=2, tp=2, pp=1, cp=2, ep=2)  # 8 ranks: context and expert parallel too
    mesh.tp_group, mesh.cp_group, mesh.dp_group, mesh.pp_group
    mesh.dp_cp_group                                 # what DDP/FSDP reduce gradients over
    mesh.ep_group, mesh.expert_dp_group              # tokens travel; experts' gradients reduce
    mesh.pp_rank, mesh.dp_rank, mesh.cp_rank, mesh.tp_rank, mesh.ep_rank

The rank order is Megatron-LM's "tp-cp-dp-pp": tp innermost, then cp, then dp, pp outermost,

    rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank

The picture for 8 ranks, dp=2 tp=2 pp=2 (cp=1):

    stage 0 (pp_rank 0)         stage 1 (pp_rank 1)
              tp 0  tp 1                  tp 0  tp 1
      dp 0      0     1         dp 0        4     5
      dp 1      2     3         dp 1        6     7

and for 8 ranks, dp=2 cp=2 tp=2 (pp=1): a cp group is two ranks tp apart, a dp group two ranks
cp x tp apart:

    stage 0         cp 0 tp 0  cp 0 tp 1  cp 1 tp 0  cp 1 tp 1
      dp 0              0          1          2          3
      dp 1              4          5          6          7

tp is innermost, so tensor-parallel peers have adjacent ranks: a launcher that fills a node with
consecutive ranks puts them in one NVLink domain, where the all-reduce inside every layer belongs.
cp comes next: ring attention's K/V blocks (or Ulysses' all-to-alls) move in every attention
layer, the next most frequent traffic. dp comes after, and pp outermost, so the pipeline's
point-to-point hops (the smallest messages, a micro-batch's activations) cross nodes first.

Expert parallelism is not a fifth axis of the grid: as in practice (GShard, Megatron-LM's expert
model parallel groups) the experts are sharded over the data-parallel ranks. ep must divide dp;
the dp ranks at the same (pp, cp, tp) place split into dp/ep expert-parallel groups of ep
consecutive dp ranks (tokens travel inside one by all-to-all, each rank holding E/ep experts),
and the ranks at the same position s of every such group, over every cp rank too, hold the same
experts: the expert-data-parallel group (dp/ep x cp ranks), over which the experts' gradients
are summed (minipar.parallel.expert.groups). dp = 4, ep = 2, E = 4 (cp = tp = pp = 1):

    rank:      0        1        2        3
    experts:   e0 e1    e2 e3    e0 e1    e2 e3      ep groups [0 1] [2 3]; expert dp [0 2] [1 3]

Which collective runs on which group (one step of training a GPT):
- tp_group (rows of a cell's tp columns): an all-reduce of activations after every attention and
  MLP block, forward and backward: small, frequent, latency-bound, on the critical path.
- cp_group (the same tp rank of each cp column): ring attention's K/V blocks point to point in
  every attention layer (dK/dV behind them backward), or Ulysses' four all-to-alls each way.
- dp_cp_group (every dp and cp rank of one (pp, tp) place; = dp_group when cp = 1): the gradient
  all-reduce (DDP) or reduce-scatter + all-gather (FSDP) of the non-expert parameters, once per
  step: each cp rank's gradient covers only its tokens, so they are reduced as dp ranks' are.
- ep_group: two all-to-alls of routed tokens per MoE layer forward, two backward;
  expert_dp_group: one all-reduce of the experts' gradients per step.
- pp_group (same place on each stage): send/recv of a micro-batch's activations forward and of
  their gradients backward, point-to-point only.

Which axes stay inside a node: the mesh reads the world's node map (runtime/nodes.py) and says,
per axis, whether each of its groups sits on one node (`mesh.placement`: {"tp": "inside a node",
"dp": "across nodes", ...}). A tp or cp group that spans nodes puts the every-layer traffic on
the slow link: DeviceMesh warns (MeshAcrossNodesWarning), or refuses with
`across_nodes="refuse"` (or MINIPAR_MESH_ACROSS_NODES=refuse); `minipar train` and `minipar
plan` print where each axis runs.

Creating the groups is collective over `group`: every rank takes part in creating every
sub-group (minipar.new_group's rule, as in torch.distributed), members or not, in the same
order; an axis whose groups are another's (cp = 1: dp_cp is dp) reuses them. `MeshShape` is the
arithmetic alone (no ranks needed), for drawings and the planner.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

from minipar import runtime

AXES = ("pp", "dp", "cp", "tp")  # outermost first: a rank's number is its position in this order

HOT_AXES = ("tp", "cp")  # traffic in every layer: must not cross between nodes
ACROSS_ENV = "MINIPAR_MESH_ACROSS_NODES"  # "warn" (default), "refuse" or "allow"
INSIDE, ACROSS = "inside a node", "across nodes"


class MeshAcrossNodesWarning(UserWarning):
    """A tp or cp group of the mesh spans nodes."""


# what moves on each group, for the drawing and lessons 08-10
TRAFFIC = {
    "tp": "all-reduce of activations in every block (forward and backward)",
    "cp": "K/V blocks around the ring (or Ulysses' 4 all-to-alls) in every attention layer",
    "dp": "all-reduce (DDP) or reduce-scatter + all-gather (FSDP) of gradients, once a step",
    "pp": "send/recv of micro-batch activations forward, their gradients backward",
    "ep": "all-to-all of routed tokens there and back in every MoE layer (forward, backward)",
    "expert_dp": "all-reduce of the experts' gradients, once a step",
}


def _check_degree(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def describe(dp: int, tp: int, pp: int, cp: int = 1, ep: int = 1) -> str:
    """ "dp=2 x tp=2 x pp=2", with " x cp=C" and ", ep=E" when they are not 1."""
    text = f"dp={dp}" + (f" x cp={cp}" if cp > 1 else "") + f" x tp={tp} x pp={pp}"
    return text + (f", ep={ep}" if ep > 1 else "")


@dataclass(frozen=True)
class MeshShape:
    """The (pp, dp, cp, tp) grid of dp * cp * tp * pp ranks, tp innermost, and ep over dp.
    Pure arithmetic."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "cp", "ep"):
            _check_degree(name, getattr(self, name))
        if self.dp % self.ep:
            raise ValueError(
                f"ep={self.ep} must divide dp={self.dp}: the experts are sharded over the "
                "data-parallel ranks"
            )

    @property
    def size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def degree(self, axis: str) -> int:
        if axis not in AXES:
            raise ValueError(
                f"axis must be one of {AXES}, got {axis!r} (ep is laid over dp: "
                "expert_groups(), expert_dp_groups())"
            )
        return getattr(self, axis)

    def rank_of(self, pp: int, dp: int, tp: int, cp: int = 0) -> int:
        """The rank at grid position (pp, dp, cp, tp)."""
        for axis, value in zip(("pp", "dp", "tp", "cp"), (pp, dp, tp, cp)):
            if not 0 <= value < self.degree(axis):
                raise ValueError(f"{axis} coordinate {value} is outside 0..{self.degree(axis) - 1}")
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def position(self, rank: int) -> dict:
        """{axis: coordinate} of a rank on every axis, ep (its place in its ep group) too."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is outside the mesh of {self.size} ranks")
        out, rest = {}, rank
        for axis in reversed(AXES):  # tp first: the innermost axis is the remainder
            out[axis], rest = rest % self.degree(axis), rest // self.degree(axis)
        out["ep"] = out["dp"] % self.ep
        return {axis: out[axis] for axis in (*AXES, "ep")}

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp_rank, dp_rank, tp_rank) of a rank (`position` has cp and ep too)."""
        where = self.position(rank)
        return where["pp"], where["dp"], where["tp"]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along `axis`, each a list of ranks ordered by that axis's coordinate, in
        a fixed order (the order in which every rank creates them)."""
        self.degree(axis)
        others = [a for a in AXES if a != axis]
        return [
            [self._rank({**fixed, axis: k}) for k in range(self.degree(axis))]
            for fixed in self._places(others)
        ]

    def dp_cp_groups(self) -> list[list[int]]:
        """The ranks of each (pp, tp) place over every dp and cp coordinate (dp-major): the
        ranks whose gradients of a replicated parameter are averaged (= groups("dp") if cp=1)."""
        inner = [(d, c) for d in range(self.dp) for c in range(self.cp)]
        return [
            [self._rank({**fixed, "dp": d, "cp": c}) for d, c in inner]
            for fixed in self._places(["pp", "tp"])
        ]

    def expert_groups(self) -> list[list[int]]:
        """The expert-parallel groups: ep consecutive dp ranks of one (pp, cp, tp) place."""
        return [
            [self._rank({**fixed, "dp": g * self.ep + s}) for s in range(self.ep)]
            for fixed in self._places(["pp", "cp", "tp"])
            for g in range(self.dp // self.ep)
        ]

    def expert_dp_groups(self) -> list[list[int]]:
        """The ranks that hold the same experts: position s of every ep group of one (pp, tp)
        place, over every cp rank (dp/ep x cp ranks)."""
        return [
            [
                self._rank({**fixed, "dp": g * self.ep + s, "cp": c})
                for g in range(self.dp // self.ep)
                for c in range(self.cp)
            ]
            for fixed in self._places(["pp", "tp"])
            for s in range(self.ep)
        ]

    def _places(self, axes) -> list[dict]:
        """Every combination of coordinates on `axes`, the first axis slowest."""
        places = [{}]
        for axis in axes:
            places = [{**p, axis: k} for p in places for k in range(self.degree(axis))]
        return places

    def _rank(self, where: dict) -> int:
        return self.rank_of(where["pp"], where["dp"], where["tp"], where["cp"])

    def group_of(self, axis: str, rank: int) -> list[int]:
        """The ranks of `rank`'s group along `axis` (or "dp_cp", "ep", "expert_dp")."""
        return next(g for g in self.all_groups(axis) if rank in g)

    def all_groups(self, kind: str) -> list[list[int]]:
        """groups(axis) for a grid axis; the dp_cp, ep and expert_dp groups by those names."""
        special = {
            "dp_cp": self.dp_cp_groups,
            "ep": self.expert_groups,
            "expert_dp": self.expert_dp_groups,
        }
        return special[kind]() if kind in special else self.groups(kind)

    def __str__(self) -> str:
        return describe(self.dp, self.tp, self.pp, self.cp, self.ep)

    def hybrid_groups(self, shard: int) -> dict[str, list[list[int]]]:
        """Hybrid sharding's groups over the dp axis: {"dp_shard": runs of `shard` consecutive
        dp ranks of each dp group (the closest ranks: one node's when a node holds them),
        "dp_replicate": the ranks at the same place of every run of a dp group}."""
        if self.dp % shard:
            raise ValueError(f"dp_shard={shard} must divide dp={self.dp}")
        runs = [g[i : i + shard] for g in self.groups("dp") for i in range(0, len(g), shard)]
        copies = [g[j::shard] for g in self.groups("dp") for j in range(shard)]
        return {"dp_shard": runs, "dp_replicate": copies}

    def hybrid_placement(self, shard: int, node_of) -> dict:
        """{"dp_shard": INSIDE or ACROSS, "dp_replicate": ...}, as `placement` says them."""
        if isinstance(node_of, int):
            node_of = [r // node_of for r in range(self.size)]
        return {
            kind: ACROSS if any(len({node_of[r] for r in g}) > 1 for g in groups) else INSIDE
            for kind, groups in self.hybrid_groups(shard).items()
        }

    def placement(self, node_of) -> dict:
        """{axis: INSIDE or ACROSS} for every axis of degree > 1 (and "ep"): ACROSS when one
        of its groups holds ranks of two nodes; `node_of[r]` is mesh rank r's node (or an
        int k: consecutive ranks fill nodes of k, as a launcher does)."""
        if isinstance(node_of, int):
            node_of = [r // node_of for r in range(self.size)]
        kinds = [a for a in ("tp", "cp", "dp", "pp", "ep") if getattr(self, a) > 1]
        return {
            a: ACROSS
            if any(len({node_of[r] for r in g}) > 1 for g in self.all_groups(a))
            else INSIDE
            for a in kinds
        }


GROUPS = ("tp", "cp", "dp", "pp", "dp_cp", "ep", "expert_dp")  # the order every rank builds them


def _check_hot_axes(shape: MeshShape, placement: dict, mode, first: bool) -> None:
    """Refuse (mode or MINIPAR_MESH_ACROSS_NODES "refuse": on every rank) or warn (on the
    group's first rank, `first`: one line a job) when tp or cp spans nodes."""
    mode = mode or os.environ.get(ACROSS_ENV) or "warn"
    if mode not in ("warn", "refuse", "allow"):
        raise ValueError(f"across_nodes={mode!r}: use 'warn', 'refuse' or 'allow'")
    crossing = [a for a in HOT_AXES if placement.get(a) == ACROSS]
    if not crossing or mode == "allow":
        return
    text = (
        f"DeviceMesh {shape}: the {' and '.join(crossing)} group{'s' if len(crossing) > 1 else ''}"
        f" span{'' if len(crossing) > 1 else 's'} nodes, so "
        + "; ".join(TRAFFIC[a] for a in crossing)
        + " crosses the link between nodes; fill each node with whole tp x cp groups (fewer "
        "ranks per group, or more per node)"
    )
    if mode == "refuse":
        raise ValueError(text + f" (refused: across_nodes / {ACROSS_ENV}=refuse)")
    if first:
        warnings.warn(text, MeshAcrossNodesWarning, stacklevel=3)


class DeviceMesh:
    """dp * cp * tp * pp ranks of `group` (None: the default group) on a (pp, dp, cp, tp) grid,
    with this rank's `tp_group`, `cp_group`, `dp_group`, `pp_group`, `dp_cp_group`, `ep_group`
    and `expert_dp_group`, and its coordinates (`ep` must divide `dp`).

    Building it moves no tensor bytes: it creates every group of every kind, each creation a
    collective over `group` (an MPI_Comm_split); a kind whose groups equal an earlier kind's
    takes those (cp = 1: dp_cp is dp; ep = 1: expert_dp is dp_cp). The groups are plain minipar
    groups: pass them explicitly to the layers (no global state beyond the default group).
    """

    def __init__(
        self, dp: int = 1, tp: int = 1, pp: int = 1, group=None, *, cp=1, ep=1, across_nodes=None
    ):
        for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)):
            _check_degree(name, value)
        comm = runtime.resolve(group)
        n = dp * cp * tp * pp
        if n != comm.size:  # every rank sees the same numbers, so every rank raises
            raise ValueError(
                f"DeviceMesh: {describe(dp, tp, pp, cp)} = {n} ranks, but the group "
                f"has {comm.size}; choose degrees whose product is {comm.size}"
            )
        self.shape = MeshShape(dp, tp, pp, cp, ep)  # ep must divide dp: raises on every rank
        self.placement = self.shape.placement(runtime.node_map(comm))
        _check_hot_axes(self.shape, self.placement, across_nodes, comm.rank == 0)  # every rank
        self.group = comm
        self.dp, self.tp, self.pp, self.cp, self.ep = dp, tp, pp, cp, ep
        self.rank = comm.rank
        where = self.shape.position(comm.rank)
        self.pp_rank, self.dp_rank, self.cp_rank, self.tp_rank = (where[a] for a in AXES)
        self.ep_rank = where["ep"]
        built: dict = {}  # the groups of a kind (as a tuple) -> this rank's communicator
        for kind in GROUPS:
            setattr(self, f"{kind}_group", self._build(kind, comm, built))

    def _build(self, kind: str, comm, built: dict):
        """Create every group of `kind` (all ranks, same order); keep the one we are in."""
        every = tuple(tuple(ranks) for ranks in self.shape.all_groups(kind))
        if every in built:  # the same groups as an earlier kind: decided from the shape alone
            return built[every]
        mine = None
        for ranks in every:
            world = [comm.global_ranks[r] for r in ranks]
            made = comm.split(list(ranks), name=f"{kind}{world}")
            if comm.rank in ranks:
                mine = made
        built[every] = mine
        return mine

    # -- where this rank sits ---------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self.shape.size

    @property
    def coords(self) -> tuple[int, int, int]:
        """(pp_rank, dp_rank, tp_rank); cp_rank and ep_rank are attributes of their own."""
        return self.pp_rank, self.dp_rank, self.tp_rank

    def ranks(self, axis: str) -> list[int]:
        """The ranks (of the mesh's group) in this rank's group along `axis` (a grid axis, or
        "dp_cp", "ep", "expert_dp")."""
        return self.shape.group_of(axis, self.rank)

    def global_ranks(self, axis: str) -> list[int]:
        """The same, as world ranks."""
        return [self.group.global_ranks[r] for r in self.ranks(axis)]

    # -- the pipeline's neighbours, as ranks of pp_group (its rank i is stage i) -----------------
    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def prev_stage(self) -> int | None:
        """pp_group rank of the stage before this one (None on the first stage)."""
        return None if self.is_first_stage else self.pp_rank - 1

    @property
    def next_stage(self) -> int | None:
        """pp_group rank of the stage after this one (None on the last stage)."""
        return None if self.is_last_stage else self.pp_rank + 1

    def hybrid_where(self, shard: int) -> str:
        """Where hybrid sharding's groups run, in words: "dp_shard inside a node, ..."."""
        placed = self.shape.hybrid_placement(shard, runtime.node_map(self.group))
        return ", ".join(f"{kind} {where}" for kind, where in placed.items())

    def where(self) -> str:
        """Where each axis runs, in words: "tp inside a node, dp across nodes"."""
        return ", ".join(f"{a} {p}" for a, p in self.placement.items()) or "one rank"

    def __repr__(self) -> str:
        extra = "".join(f", {a}={getattr(self, a)}" for a in ("cp", "ep") if getattr(self, a) > 1)
        at = f"pp={self.pp_rank}, dp={self.dp_rank}, " + (
            f"cp={self.cp_rank}, " if self.cp > 1 else ""
        )
        return (
            f"DeviceMesh(dp={self.dp}, tp={self.tp}, pp={self.pp}{extra}; rank {self.rank} of "
            f"{self.size} at {at}tp={self.tp_rank})"
        )

    def draw(self, console=None, per_node: int | None = None) -> None:
        """Print the grid with rich, this rank highlighted (see `render`)."""
        # here, not at the top of the file: rich loads only when used
        from minipar.term import Console

        world = self.group.global_ranks
        (console or Console()).print(render(self.shape, self.rank, per_node, world))


def render(shape: MeshShape, highlight: int | None = None, per_node: int | None = None, world=None):
    """A rich renderable of the grid: one panel per pipeline stage, dp rows by (cp, tp) columns.

    highlight: a rank to mark; per_node: ranks per node, to show which node holds each rank
    (consecutive ranks fill a node); world: the world rank of each mesh rank (default: same).
    With ep > 1 each row is labelled with its expert-parallel group and the experts' share.
    """
    from rich import box
    from rich.columns import Columns
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    world = list(range(shape.size)) if world is None else list(world)
    colours = ("cyan", "magenta", "green", "yellow", "blue", "red")
    columns = [(cp, tp) for cp in range(shape.cp) for tp in range(shape.tp)]
    panels = []
    for pp in range(shape.pp):
        table = Table(box=box.SIMPLE, show_header=True, pad_edge=False)
        table.add_column("")
        for cp, tp in columns:
            table.add_column((f"cp {cp} " if shape.cp > 1 else "") + f"tp {tp}", justify="center")
        for dp in range(shape.dp):
            cells = []
            for cp, tp in columns:
                r = shape.rank_of(pp, dp, tp, cp)
                label = f"{world[r]}" + (f" n{world[r] // per_node}" if per_node else "")
                style = colours[world[r] // per_node % len(colours)] if per_node else ""
                if r == highlight:
                    style = "bold reverse"
                cells.append(Text(label, style=style))
            ep = f"  ep {dp // shape.ep}.{dp % shape.ep}" if shape.ep > 1 else ""
            table.add_row(f"dp {dp}{ep}", *cells)
        panels.append(Panel(table, title=f"stage {pp} (pp {pp})", expand=False))
    cp = ", a column's cp ranks of one tp rank a cp group" if shape.cp > 1 else ""
    ep = (
        f"; ep {shape.ep}: rows g.0 .. g.{shape.ep - 1} exchange tokens, rows with the same .s "
        "hold the same experts"
        if shape.ep > 1
        else ""
    )
    legend = Text.assemble(
        ("rank", "bold"),
        (" n<node>" if per_node else "", ""),
        f"   {shape}: rows share a tp group{cp}, columns a dp group, "
        f"the same cell across stages a pp group{ep}",
    )
    return Group(Columns(panels), legend)
