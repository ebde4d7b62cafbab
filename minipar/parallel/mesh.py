"""The device mesh: a group's ranks laid on a (pp, dp, tp) grid, one sub-group per line of it.

    mesh = DeviceMesh(dp=2, tp=2, pp=2)      # 8 ranks
    mesh.tp_group, mesh.dp_group, mesh.pp_group
    mesh.pp_rank, mesh.dp_rank, mesh.tp_rank

The picture for 8 ranks, dp=2 tp=2 pp=2 (rank = (pp_rank * dp + dp_rank) * tp + tp_rank):

    stage 0 (pp_rank 0)         stage 1 (pp_rank 1)
              tp 0  tp 1                  tp 0  tp 1
      dp 0      0     1         dp 0        4     5
      dp 1      2     3         dp 1        6     7

tp is innermost, so tensor-parallel peers have adjacent ranks: a launcher that fills a node with
consecutive ranks puts them in one NVLink domain, where the all-reduce inside every layer belongs.
dp comes next and pp outermost, so the pipeline's point-to-point hops (the smallest messages, a
micro-batch's activations) are the ones that cross nodes first.

Which collective runs on which group (one step of training a GPT):
- tp_group (rows of the picture): an all-reduce of activations after every attention and MLP
  block, forward and backward: small, frequent, latency-bound, on the critical path.
- dp_group (columns): one all-reduce (DDP) or reduce-scatter + all-gather (FSDP) of the
  gradients per step, large and overlappable with the backward pass.
- pp_group (same place on each stage): send/recv of a micro-batch's activations forward and of
  their gradients backward, point-to-point only.

Creating the groups is collective over `group`: every rank takes part in creating every
sub-group (minipar.new_group's rule, as in torch.distributed), members or not, in the same
order. `MeshShape` is the arithmetic alone (no ranks needed), for drawings and the planner.
"""

from __future__ import annotations

from dataclasses import dataclass

from minipar import runtime

AXES = ("pp", "dp", "tp")  # outermost first: a rank's number is its position in this order

# what moves on each axis's group, for the drawing and lesson 08
TRAFFIC = {
    "tp": "all-reduce of activations in every block (forward and backward)",
    "dp": "all-reduce (DDP) or reduce-scatter + all-gather (FSDP) of gradients, once a step",
    "pp": "send/recv of micro-batch activations forward, their gradients backward",
}


def _check_degree(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class MeshShape:
    """The (pp, dp, tp) grid of dp * tp * pp ranks, tp innermost. Pure arithmetic."""

    dp: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self):
        for name in ("dp", "tp", "pp"):
            _check_degree(name, getattr(self, name))

    @property
    def size(self) -> int:
        return self.dp * self.tp * self.pp

    def degree(self, axis: str) -> int:
        if axis not in AXES:
            raise ValueError(f"axis must be one of {AXES}, got {axis!r}")
        return getattr(self, axis)

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        """The rank at grid position (pp, dp, tp)."""
        for axis, value in zip(AXES, (pp, dp, tp)):
            if not 0 <= value < self.degree(axis):
                raise ValueError(f"{axis} coordinate {value} is outside 0..{self.degree(axis) - 1}")
        return (pp * self.dp + dp) * self.tp + tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp_rank, dp_rank, tp_rank) of a rank."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is outside the mesh of {self.size} ranks")
        return rank // (self.dp * self.tp), rank // self.tp % self.dp, rank % self.tp

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along `axis`, each a list of ranks ordered by that axis's coordinate, in
        a fixed order (the order in which every rank creates them)."""
        self.degree(axis)
        others = [a for a in AXES if a != axis]
        out = []
        for i in range(self.degree(others[0])):
            for j in range(self.degree(others[1])):
                fixed = {others[0]: i, others[1]: j}
                out.append([self.rank_of(**{**fixed, axis: k}) for k in range(self.degree(axis))])
        return out

    def group_of(self, axis: str, rank: int) -> list[int]:
        """The ranks of `rank`'s group along `axis`."""
        return next(g for g in self.groups(axis) if rank in g)

    def __str__(self) -> str:
        return f"dp={self.dp} x tp={self.tp} x pp={self.pp}"


class DeviceMesh:
    """dp * tp * pp ranks of `group` (None: the default group) on a (pp, dp, tp) grid, with this
    rank's `dp_group`, `tp_group` and `pp_group` and its coordinates.

    Building it moves no tensor bytes: it creates pp*dp tp-groups, pp*tp dp-groups and dp*tp
    pp-groups, each creation a collective over `group` (an MPI_Comm_split). The groups are plain
    minipar groups: pass them explicitly to the layers (no global state beyond the default group).
    """

    def __init__(self, dp: int = 1, tp: int = 1, pp: int = 1, group=None):
        for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
            _check_degree(name, value)
        comm = runtime.resolve(group)
        if dp * tp * pp != comm.size:  # every rank sees the same numbers, so every rank raises
            raise ValueError(
                f"DeviceMesh: dp={dp} x tp={tp} x pp={pp} = {dp * tp * pp} ranks, but the group "
                f"has {comm.size}; choose degrees whose product is {comm.size}"
            )
        self.shape = MeshShape(dp, tp, pp)
        self.group = comm
        self.dp, self.tp, self.pp = dp, tp, pp
        self.rank = comm.rank
        self.pp_rank, self.dp_rank, self.tp_rank = self.shape.coords(comm.rank)
        self.tp_group = self._build("tp", comm)
        self.dp_group = self._build("dp", comm)
        self.pp_group = self._build("pp", comm)

    def _build(self, axis: str, comm):
        """Create every group along `axis` (all ranks, same order); keep the one we are in."""
        mine = None
        for ranks in self.shape.groups(axis):
            world = [comm.global_ranks[r] for r in ranks]
            made = comm.split(ranks, name=f"{axis}{world}")
            if comm.rank in ranks:
                mine = made
        return mine

    # -- where this rank sits ---------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self.shape.size

    @property
    def coords(self) -> tuple[int, int, int]:
        """(pp_rank, dp_rank, tp_rank)."""
        return self.pp_rank, self.dp_rank, self.tp_rank

    def ranks(self, axis: str) -> list[int]:
        """The ranks (of the mesh's group) in this rank's group along `axis`."""
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

    def __repr__(self) -> str:
        return (
            f"DeviceMesh(dp={self.dp}, tp={self.tp}, pp={self.pp}; rank {self.rank} of "
            f"{self.size} at pp={self.pp_rank}, dp={self.dp_rank}, tp={self.tp_rank})"
        )

    def draw(self, console=None, per_node: int | None = None) -> None:
        """Print the grid with rich, this rank highlighted (see `render`)."""
        # here, not at the top of the file: rich loads only when used
        from minipar.term import Console

        world = self.group.global_ranks
        (console or Console()).print(render(self.shape, self.rank, per_node, world))


def render(shape: MeshShape, highlight: int | None = None, per_node: int | None = None, world=None):
    """A rich renderable of the grid: one panel per pipeline stage, dp rows by tp columns.

    highlight: a rank to mark; per_node: ranks per node, to show which node holds each rank
    (consecutive ranks fill a node); world: the world rank of each mesh rank (default: same).
    """
    from rich import box
    from rich.columns import Columns
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    world = list(range(shape.size)) if world is None else list(world)
    colours = ("cyan", "magenta", "green", "yellow", "blue", "red")
    panels = []
    for pp in range(shape.pp):
        table = Table(box=box.SIMPLE, show_header=True, pad_edge=False)
        table.add_column("")
        for tp in range(shape.tp):
            table.add_column(f"tp {tp}", justify="center")
        for dp in range(shape.dp):
            cells = []
            for tp in range(shape.tp):
                r = shape.rank_of(pp, dp, tp)
                label = f"{world[r]}" + (f" n{world[r] // per_node}" if per_node else "")
                style = colours[world[r] // per_node % len(colours)] if per_node else ""
                if r == highlight:
                    style = "bold reverse"
                cells.append(Text(label, style=style))
            table.add_row(f"dp {dp}", *cells)
        panels.append(Panel(table, title=f"stage {pp} (pp {pp})", expand=False))
    legend = Text.assemble(
        ("rank", "bold"),
        (" n<node>" if per_node else "", ""),
        f"   {shape}: rows share a tp group, columns a dp group, "
        "the same cell across stages a pp group",
    )
    return Group(Columns(panels), legend)
