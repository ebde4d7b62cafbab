"""Which ranks hold copies of a parameter: what the gradient norm needs to count each number once.

    mark_sharded(layer.weight, tp_group)         # a different piece on every rank of tp_group
    mark_replicated(q, mesh.expert_dp_group)     # the same tensor on every rank of that group
    counting_groups(pieces(q)[0][2], lines)      # counted where rank 0 of each of these
    counted_here(groups)

Megatron-LM's rule is the default: a parameter not marked is a copy. On a DeviceMesh it is the
same tensor on every rank of its tp group (a LayerNorm, a RowParallelLinear's bias, a plain
torch module beside the parallel layers) and, once its gradient is reduced over dp (by DDP,
FSDP or by hand), on every rank of its dp x cp group: the default lines are (tp_group,
dp_cp_group), and the copy counts on their rank 0. Only pipeline stages hold different layers
on each rank of pp, so pp is no line. Without a mesh the default group is the one line (data
parallelism: everything a copy).

What is not a copy must say so, and minipar's layers do:

    Column/RowParallelLinear's slices, the vocabulary-parallel    sharded over tp
    embedding and head
    an FSDP shard                                                  sharded over its group
    an MoE layer's experts                                         sharded over ep, and copied
                                                                   over expert_dp (mesh_model)
    a pipeline stage's layers                                      sharded over pp
    the last stage's copy of a tied head                           copied over pp (stage 0's
                                                                   counts)

A line whose every rank holds a different piece is dropped (the piece counts on each); a group
marked copied is added. A shard that covers part of a line (experts over ep = 2 of dp = 4) needs
to be told where its copies are, a group inside that line of the right size: without one the
norm would be wrong, so `counting_groups` raises AmbiguousCopies saying what to mark. An FSDP
shard mixes pieces of several tensors (a LayerNorm beside a tp slice), so it carries
`replica_pieces`, one (start, stop, marks) per piece. Nothing moves here.
"""

from __future__ import annotations

from minipar import runtime

ATTRIBUTE = "replicated_over"  # a parameter's tuple of groups it is copied over, marked
SHARDED = "sharded_over"  # a parameter's tuple of groups it is cut over, marked
PIECES = "replica_pieces"  # a flat shard's [(start, stop, marks)], in the shard's numbers


class AmbiguousCopies(ValueError):
    """A parameter's marks leave open which ranks hold its copies."""


def _mark(params, group, attribute: str) -> None:
    if runtime.get_world_size(group) == 1:
        return
    for q in [params] if hasattr(params, "grad") else params:
        groups = getattr(q, attribute, ())
        if not any(g is group for g in groups):
            setattr(q, attribute, (*groups, group))


def mark_replicated(params, group) -> None:
    """Mark each parameter of `params` (one, or an iterable) as the same tensor on every rank of
    `group`; a group of one rank (or a group already marked) adds nothing."""
    _mark(params, group, ATTRIBUTE)


def mark_sharded(params, group) -> None:
    """Mark each parameter of `params` as a different piece on every rank of `group` (a tensor
    parallel slice, a shard, a stage's layers): the default copy over that line is undone."""
    _mark(params, group, SHARDED)


def replicated_over(q) -> tuple:
    """The groups `q` is marked copied over (() when none)."""
    return getattr(q, ATTRIBUTE, ())


def marks(q) -> tuple[tuple, tuple]:
    """(sharded groups, replicated groups) as marked on `q`."""
    return getattr(q, SHARDED, ()), replicated_over(q)


def pieces(q) -> list[tuple[int, int, tuple]]:
    """(start, stop, marks) for the runs of q's numbers (flattened): one for a plain tensor,
    one per original tensor for a flat shard that carries `replica_pieces`."""
    return getattr(q, PIECES, None) or [(0, q.numel(), marks(q))]


def flat_pieces(layout, start: int, stop: int) -> list[tuple[int, int, tuple]]:
    """The pieces of the flat vector's numbers start .. stop (one rank's shard), from a layout
    of (offset, numel, marks) per tensor flattened into it, in the shard's own numbering; the
    padding after the last tensor belongs to no piece (its gradient is zero)."""
    out = []
    for offset, numel, mark in layout:
        lo, hi = max(offset, start), min(offset + numel, stop)
        if lo < hi:
            out.append((lo - start, hi - start, mark))
    return out


def default_lines(mesh) -> dict:
    """{name: group} of the lines a parameter that is not marked is copied over."""
    if mesh is None:
        return {"default group": None}
    return {"tp": mesh.tp_group, "dp x cp": mesh.dp_cp_group}


class Resolver:
    """counting_groups for one call: the groups' world ranks looked up once."""

    def __init__(self, lines: dict, mesh=None):
        self.lines, self.mesh, self._ranks = lines, mesh, {}

    def ranks(self, group) -> frozenset:
        key = id(group)
        if key not in self._ranks:
            self._ranks[key] = frozenset(runtime.get_process_group_ranks(group))
        return self._ranks[key]

    def counting_groups(self, mark, shape=()) -> tuple:
        """The groups whose rank 0 counts a tensor with these marks: the default lines less the
        ones it is cut over, and the groups it is marked copied over."""
        sharded, copied = mark
        out = []
        for name, line in self.lines.items():
            whole = self.ranks(line)
            cut = [self.ranks(g) & whole for g in sharded]
            cut = max(cut, key=len, default=frozenset())
            if len(cut) <= 1:
                out.append(line)
            elif cut != whole and not self._told(whole, len(cut), copied):
                raise AmbiguousCopies(self._say(shape, name, whole, cut))
        return (*out, *copied)

    def _told(self, whole, pieces: int, copied) -> bool:
        """Whether a group inside the line says where a partial shard's copies are."""
        return any(self.ranks(g) <= whole and len(self.ranks(g)) * pieces == len(whole)
                   for g in copied)  # fmt: skip

    def _say(self, shape, name, whole, cut) -> str:
        where = "pass mesh= (the DeviceMesh it was cut on), or " if self.mesh is None else ""
        return (
            f"a parameter of shape {tuple(shape)} is marked sharded over ranks {sorted(cut)}, "
            f"{len(cut)} of the {len(whole)} ranks {sorted(whole)} of the {name} line that "
            f"hold copies by default: the gradient norm cannot tell which ranks hold its "
            f"copies; {where}mark them with minipar.parallel.replicas.mark_replicated(param, "
            f"group) (an MoE's experts: mesh.expert_dp_group)"
        )


def counted_here(groups) -> bool:
    """Whether this rank counts a tensor copied over `groups`: it is rank 0 of every one."""
    return all(runtime.get_rank(g) == 0 for g in groups)
