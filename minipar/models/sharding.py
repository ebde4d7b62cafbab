"""How a dense GPT tensor is cut across a tensor-parallel group, and how the pieces come back.

    tp_layout("blocks.3.attn.qkv.weight")        # "qkv"
    piece = shard(name, full, tp_rank, tp)        # this rank's slice (no communication)
    full = gather(name, piece, tp_group)          # every rank's slice put back (one all-gather)
    state = gather_dense(pieces, mesh, config)    # the whole dense state, on every rank

The GPT's plan (TP_PLAN below) names the tensor-parallel style of each of its modules; how a
style cuts a tensor is minipar/parallel/tensor/plan.py's, the very functions the layers'
`from_dense` use, so `shard` of a dense weight equals the parallel layer's own weight, bit for
bit:

    embed.tok, head.proj    vocab: rows (the vocabulary), padded when tp does not divide it
    attn.qkv                qkv: q, k and v each split by rows (heads), stacked again
    attn.proj, mlp.fc2      rowwise: weight columns; the bias whole
    mlp.fc1                 colwise: rows
    everything else         whole on every rank: LayerNorms, the position embedding, an
                            MoE block's router and experts (tensor parallelism leaves them
                            whole); the experts are cut by expert instead, over the
                            expert-parallel group: rows e*E/ep .. of w1, b1, w2, b2

A vocabulary tp does not divide is padded to padded_vocab(V, tp, VOCAB_MULTIPLE) rows (plan.py):
`shard` adds the zero rows, `gather` drops them, so the dense state, the checkpoints and a
re-cut for another tp never see them; the layers keep them out of the loss and the argmax.

`shard` applies to anything shaped like a parameter (AdamW's exp_avg and exp_avg_sq too), so a
checkpoint's optimizer state is sliced for a new layout the way its weights are.
"""

from __future__ import annotations

import torch

from minipar import collectives
from minipar.models.gpt import GPT
from minipar.parallel.tensor import plan

TP_PLAN = {  # module name (its end) -> tensor-parallel style (parallel/tensor/plan.py)
    "embed.tok": "vocab",
    "attn.qkv": "qkv",
    "attn.proj": "rowwise",
    "mlp.fc1": "colwise",
    "mlp.fc2": "rowwise",
    "head.proj": "vocab",
}
# the GPT's vocabulary padding: a multiple of VOCAB_MULTIPLE x tp rows (Megatron pads to 128 x
# tp; 1 pads only where tp does not divide V, leaving the tiny GPT's 256 as it is)
VOCAB_MULTIPLE = plan.VOCAB_MULTIPLE


def tp_layout(name: str) -> str | None:
    """How a dense parameter is cut: "rows", "cols", "vocab", "qkv" or None (whole), from
    TP_PLAN."""
    module, _, param = name.rpartition(".")
    for suffix, style in TP_PLAN.items():
        if module == suffix or module.endswith("." + suffix):
            return plan.cut_of(style, param)
    return None


def is_expert(name: str) -> bool:
    """A parameter of an MoE block's experts (stacked by expert: (E, ...), cut over ep)."""
    return ".mlp.experts." in f".{name}"


def shard(
    name: str, full: torch.Tensor, tp_rank: int, tp: int, ep_rank: int = 0, ep: int = 1
) -> torch.Tensor:
    """This rank's slice of the dense tensor `full` called `name` (a fresh contiguous copy):
    its tp slice, or for an expert tensor its ep rank's experts (contiguous rows)."""
    if is_expert(name):
        return plan.shard(full, "rows", ep_rank, ep)
    return plan.shard(full, tp_layout(name), tp_rank, tp, VOCAB_MULTIPLE)


def gather(
    name: str, piece: torch.Tensor, tp_group, rows: int | None = None, ep_group=None
) -> torch.Tensor:
    """The dense tensor from every tp rank's `piece` (one all-gather for a cut tensor; an
    expert tensor: one all-gather of the experts' rows over ep_group); rows: the dense
    tensor's, so that a padded vocabulary comes back without its padding."""
    if is_expert(name):
        return plan.gather(piece, "rows", ep_group) if ep_group is not None else piece
    return plan.gather(piece, tp_layout(name), tp_group, rows)


def dense_shapes(config) -> dict[str, tuple]:
    """Every dense parameter's name and shape, in the dense model's order (a tied head's
    projection is listed once, as embed.tok.weight, as GPT.named_parameters lists it)."""
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = GPT(config)
    return {name: tuple(q.shape) for name, q in model.named_parameters()}


def gather_dense(pieces: dict, mesh, config) -> dict[str, torch.Tensor]:
    """The dense tensors of the whole model, on every rank, from each rank's `pieces` (dense
    name -> this rank's tp slice, for the names its pipeline stage holds).

    What moves: one all-gather per split tensor on tp_group (per expert tensor on ep_group),
    then (pp > 1) one all-reduce over pp_group of a flat buffer of all the model's numbers, each
    stage filling its own names and zeros elsewhere (a sum is a gather when exactly one rank
    contributes each number)."""
    ep_group = mesh.ep_group if mesh.ep > 1 else None
    shapes = dense_shapes(config)
    full = {
        name: gather(name, piece, mesh.tp_group, shapes[name][0], ep_group)
        for name, piece in pieces.items()
    }
    if mesh.pp == 1:
        return {name: full[name] for name in shapes}
    sizes = [torch.Size(shape).numel() for shape in shapes.values()]
    flat = torch.zeros(sum(sizes), dtype=torch.float32)
    offset = 0
    for name, size in zip(shapes, sizes):
        if name in full:
            flat[offset : offset + size] = full[name].reshape(-1).float().cpu()
        offset += size
    collectives.all_reduce(flat, group=mesh.pp_group)
    out, offset = {}, 0
    for (name, shape), size in zip(shapes.items(), sizes):
        out[name] = flat[offset : offset + size].view(shape).clone()
        offset += size
    return out
