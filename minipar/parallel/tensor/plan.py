"""The tensor-parallel layout as data: which way each kind of layer cuts its dense tensors.

A layer is one of five styles (torchtitan's ColwiseParallel and RowwiseParallel, Megatron's
VocabParallelEmbedding are the same ideas); each style says how its weight and bias are cut:

    style      layer                      weight (out, in)          bias (out,)
    colwise    ColumnParallelLinear       rows: dim 0 in p blocks   rows
    rowwise    RowParallelLinear          cols: dim 1 in p blocks   whole (added once, after g)
    vocab      VocabParallelEmbedding,    vocab: rows, padded       vocab
               VocabParallelHead
    qkv        the attention's qkv        rows of q, of k and of v  the same
    replicate  LayerNorm, positions       whole                     whole

    cut_of("rowwise", "weight")            # "cols"
    piece = shard(full, "cols", rank, p)   # this rank's piece (a copy; no communication)
    full = gather(piece, "cols", group)    # the dense tensor again (one all-gather)

The vocab cut is the rows cut of a table whose rows are a vocabulary, padded first, Megatron's
way (its --make-vocab-size-divisible-by): V rows become padded_vocab(V, p, multiple), the
smallest multiple of `multiple` x p that holds them, zero rows at the end, so that any V splits
(GPT-2's 50,257 divides by nothing). Rank r holds rows r*Vp/p:(r+1)*Vp/p of the padded table;
gather(..., rows=V) drops the padding again. The layers keep the padded rows out of the model:
no token looks them up, their logits are -inf, so they never win an argmax, take no softmax
share and get no gradient (embedding.py, head.py).

    padded_vocab(67, 4)                    # 68: 17 rows a rank, the last one padding
    padded_vocab(50257, 2, multiple=128)   # 50432, as Megatron pads GPT-2 for tp = 2

Every layer's `from_dense`, the GPT's plan (models/sharding.py: which of its modules is which
style) and a checkpoint's re-cut for another layout call these, so they agree by construction.
"""

from __future__ import annotations

import torch

from minipar import collectives, runtime

VOCAB_MULTIPLE = 1  # default padding: none where the vocabulary divides (Megatron's is 128)

CUTS = {  # style -> {parameter name: cut}; a parameter not listed is whole on every rank
    "colwise": {"weight": "rows", "bias": "rows"},
    "rowwise": {"weight": "cols"},
    "vocab": {"weight": "vocab", "bias": "vocab"},
    "qkv": {"weight": "qkv", "bias": "qkv"},
    "replicate": {},
}


def cut_of(style: str, param: str) -> str | None:
    """How a layer of `style` cuts its parameter `param`: "rows", "cols", "vocab", "qkv" or
    None."""
    if style not in CUTS:
        raise ValueError(f"unknown tensor-parallel style {style!r}; one of {', '.join(CUTS)}")
    return CUTS[style].get(param)


def padded_vocab(vocab_size: int, p: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """The vocabulary's rows once padded for p ranks: the smallest multiple of multiple * p
    that is >= vocab_size (vocab_size itself when multiple * p divides it)."""
    for name, value in (("vocab_size", vocab_size), ("vocab_multiple", multiple)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    step = multiple * p
    return -(-vocab_size // step) * step


def shard(
    full: torch.Tensor, cut: str | None, rank: int, p: int, multiple: int = VOCAB_MULTIPLE
) -> torch.Tensor:
    """Rank `rank`'s contiguous piece of the dense tensor `full` (of p), as a fresh copy.

    rows: dim 0 in p equal blocks; cols: dim 1; vocab: rows of `full` padded with zero rows to
    padded_vocab(rows, p, multiple) first; qkv: `full` is [q; k; v] stacked on dim 0, and the
    piece is this rank's block of each, stacked again; None: all of it."""
    full = full.detach()
    if cut == "vocab":
        rows = padded_vocab(full.shape[0], p, multiple)
        pad = full.new_zeros(rows - full.shape[0], *full.shape[1:])
        return torch.cat([full, pad]).chunk(p, dim=0)[rank].contiguous()
    if cut is None or p == 1:
        return full.clone()
    if cut == "rows":
        return full.chunk(p, dim=0)[rank].contiguous()
    if cut == "cols":
        return full.chunk(p, dim=1)[rank].contiguous()
    if cut != "qkv":
        raise ValueError(f"unknown cut {cut!r}; one of rows, cols, vocab, qkv, None")
    three = full.reshape(3, full.shape[0] // 3, *full.shape[1:])
    return three.chunk(p, dim=1)[rank].reshape(-1, *full.shape[1:]).contiguous()


def gather(piece: torch.Tensor, cut: str | None, group=None, rows: int | None = None):
    """The dense tensor from every rank's `piece`: one all-gather of the whole tensor's bytes
    ((p-1)/p of them received per rank) for a cut tensor, nothing for a whole one. A vocab
    cut's padding is dropped: `rows` is the dense tensor's (the vocabulary; None keeps all)."""
    p = runtime.get_world_size(group)
    piece = piece.detach()
    if cut is None or p == 1:
        return piece[:rows].clone() if cut == "vocab" else piece.clone()
    front = (piece.t() if cut == "cols" else piece).contiguous()  # minipar gathers dim-0 blocks
    out = front.new_empty((p * front.shape[0], *front.shape[1:]))
    collectives.all_gather_into_tensor(out, front, group=group)
    if cut == "cols":
        return out.t().contiguous()
    if cut == "rows":
        return out
    if cut == "vocab":
        return out[:rows].contiguous() if rows is not None else out
    # qkv: out is [q0 k0 v0 | q1 k1 v1 | ...] (rank blocks): regroup as [q0 q1 ..; k..; v..]
    width = piece.shape[0] // 3
    blocks = out.reshape(p, 3, width, *piece.shape[1:]).transpose(0, 1)
    return blocks.reshape(3 * p * width, *piece.shape[1:]).contiguous()


def load_(
    layer: torch.nn.Module,
    style: str,
    dense: torch.nn.Module,
    rank: int,
    p: int,
    multiple: int = VOCAB_MULTIPLE,
):
    """Copy this rank's pieces of `dense`'s parameters (weight, bias) into `layer`'s, moving
    `layer` first to the device and dtype of `dense` (a model built on a GPU, or in float64,
    is sharded there, not back on the CPU in float32)."""
    source = next(dense.parameters(), None)
    if source is not None:
        layer.to(device=source.device, dtype=source.dtype)
    with torch.no_grad():
        for name, param in layer.named_parameters(recurse=False):
            param.copy_(shard(getattr(dense, name), cut_of(style, name), rank, p, multiple))
    return layer
