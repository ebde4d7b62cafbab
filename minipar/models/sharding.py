"""How a dense GPT tensor is cut across a tensor-parallel group, and how the pieces come back.

    tp_layout("blocks.3.attn.qkv.weight")        # "qkv"
    piece = shard(name, full, tp_rank, tp)        # this rank's slice (no communication)
    full = gather(name, piece, tp_group)          # every rank's slice put back (one all-gather)
    state = gather_dense(pieces, mesh, config)    # the whole dense state, on every rank

The layouts are the ones the tensor-parallel layers' `from_dense` produce (so `shard` of a
dense weight equals the parallel layer's own weight, bit for bit):

    rows  dim 0 split in p contiguous blocks: the vocabulary (embed.tok, head.proj), mlp.fc1
    cols  dim 1 split: the row-parallel layers' weights (attn.proj, mlp.fc2)
    qkv   q, k and v each split by rows (heads), this rank's three blocks stacked
    None  whole on every rank: LayerNorms, position embedding, row-parallel biases

`shard` applies to anything shaped like a parameter (AdamW's exp_avg and exp_avg_sq too), so a
checkpoint's optimizer state is sliced for a new layout the way its weights are.
"""

from __future__ import annotations

import torch

from minipar import collectives, runtime
from minipar.models.gpt import GPT

ROWS = ("embed.tok.weight", "head.proj.weight", "mlp.fc1.weight", "mlp.fc1.bias")
COLS = ("attn.proj.weight", "mlp.fc2.weight")
QKV = ("attn.qkv.weight", "attn.qkv.bias")


def tp_layout(name: str) -> str | None:
    """The layout of a dense parameter name: "rows", "cols", "qkv" or None (replicated)."""
    if name.endswith(QKV):
        return "qkv"
    if name.endswith(ROWS):
        return "rows"
    return "cols" if name.endswith(COLS) else None


def shard(name: str, full: torch.Tensor, tp_rank: int, tp: int) -> torch.Tensor:
    """This tp rank's slice of the dense tensor `full` called `name` (a fresh contiguous copy)."""
    layout = tp_layout(name)
    if layout is None or tp == 1:
        return full.clone()
    if layout == "rows":
        return full.chunk(tp, dim=0)[tp_rank].contiguous()
    if layout == "cols":
        return full.chunk(tp, dim=1)[tp_rank].contiguous()
    three = full.reshape(3, full.shape[0] // 3, *full.shape[1:])  # [q; k; v]
    return three.chunk(tp, dim=1)[tp_rank].reshape(-1, *full.shape[1:]).contiguous()


def gather(name: str, piece: torch.Tensor, tp_group) -> torch.Tensor:
    """The dense tensor from every tp rank's `piece`: one all-gather of the full tensor's bytes
    ((p-1)/p of them received per rank) for a split tensor, nothing for a replicated one."""
    p = runtime.get_world_size(tp_group)
    layout = tp_layout(name)
    piece = piece.detach()
    if layout is None or p == 1:
        return piece.clone()
    front = piece.t() if layout == "cols" else piece  # minipar gathers blocks of dim 0
    front = front.contiguous()
    out = front.new_empty((p * front.shape[0], *front.shape[1:]))
    collectives.all_gather_into_tensor(out, front, group=tp_group)
    if layout == "cols":
        return out.t().contiguous()
    if layout == "rows":
        return out
    # qkv: out is [q0 k0 v0 | q1 k1 v1 | ...] (rank blocks): regroup as [q0 q1 ..; k..; v..]
    width = piece.shape[0] // 3
    blocks = out.reshape(p, 3, width, *piece.shape[1:]).transpose(0, 1)
    return blocks.reshape(3 * p * width, *piece.shape[1:]).contiguous()


def dense_shapes(config) -> dict[str, tuple]:
    """Every dense parameter's name and shape, in the dense model's order (a tied head's
    projection is listed once, as embed.tok.weight, as GPT.named_parameters lists it)."""
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = GPT(config)
    return {name: tuple(q.shape) for name, q in model.named_parameters()}


def gather_dense(pieces: dict, mesh, config) -> dict[str, torch.Tensor]:
    """The dense tensors of the whole model, on every rank, from each rank's `pieces` (dense
    name -> this rank's tp slice, for the names its pipeline stage holds).

    What moves: one all-gather per split tensor on tp_group, then (pp > 1) one all-reduce over
    pp_group of a flat buffer of all the model's numbers, each stage filling its own names and
    zeros elsewhere (a sum is a gather when exactly one rank contributes each number)."""
    full = {name: gather(name, piece, mesh.tp_group) for name, piece in pieces.items()}
    shapes = dense_shapes(config)
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
