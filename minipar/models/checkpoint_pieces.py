"""What one rank of a mesh holds, as pieces of the dense tensors, and the dense tensors put back
together from the pieces a new layout needs.

    held = held_pieces(part, opt)              # [(meta, tensor)]: weights and AdamW's state
    names = stage_names(spec, mesh)            # the dense names this rank of a layout needs
    full = assemble(entries, cut, dense_shape, reader, tp_rank, tp)   # only what it needs

A piece is a slice of one dense tensor, described by data alone (its `meta`):

    kind     "param", "exp_avg" or "exp_avg_sq"
    name     the dense name (GPT.state_dict's)
    cut, p, q   how the dense tensor was cut, into how many, and which of them this is: the
             tensor-parallel cut of models/sharding.py (rows, cols, vocab, qkv; p = tp), "rows"
             over ep for an expert tensor, or None (whole: p = 1)
    shape    the shape of that cut piece (the tp slice)
    lo, hi   the flat range of the cut piece this tensor is: the whole piece [0, numel) without
             FSDP; with FSDP, the part of it inside this rank's block of the unit's flat vector

So FSDP's shards, tensor-parallel slices, pipeline stages and experts are one vocabulary, and a
checkpoint saved at one layout reads into any other: the loader fills, for each dense name a
rank needs, only the old cut pieces that overlap its new slice (`needed`), each from its flat
ranges, and cuts its slice out of that (the other positions stay zero and are never read).
"""

from __future__ import annotations

import torch

from minipar.models import sharding
from minipar.models.parallel_gpt import stage_blocks
from minipar.parallel.tensor import plan

KINDS = ("param", "exp_avg", "exp_avg_sq")


def cut_for(name: str, mesh) -> tuple[str | None, int, int]:
    """(cut, p, q) of dense tensor `name` on this rank of `mesh`."""
    if sharding.is_expert(name):
        return ("rows", mesh.ep, mesh.ep_rank) if mesh.ep > 1 else (None, 1, 0)
    cut = sharding.tp_layout(name)
    if cut is None or mesh.tp == 1:
        return None, 1, 0
    return cut, mesh.tp, mesh.tp_rank


def held_pieces(part, opt) -> list[tuple[dict, torch.Tensor]]:
    """Every piece this rank holds: (meta, tensor) for the weights and, once AdamW has stepped,
    its exp_avg and exp_avg_sq (views of the live tensors: the caller copies them)."""
    out = []
    for name, shape, tensor, lo, hi, owner, at in _slices(part):
        cut, p, q = cut_for(name, part.mesh)
        meta = {"name": name, "cut": cut, "p": p, "q": q, "shape": list(shape), "lo": lo, "hi": hi}
        out.append(({**meta, "kind": "param"}, tensor.detach()))
        state = opt.state.get(owner) or {}
        for kind in KINDS[1:]:
            if kind in state:
                moment = state[kind].detach()
                out.append(({**meta, "kind": kind}, moment[at[0] : at[1]] if at else moment))
    return out


def _slices(part):
    """(name, cut piece's shape, tensor, lo, hi, the parameter AdamW keys it by, its range in
    that parameter or None) of every dense tensor this rank holds."""
    if not part.fsdp:
        for name, q in part.named_parameters():
            yield name, tuple(q.shape), q, 0, q.numel(), q, None
        return
    for module in part.wrapped:
        for piece in _fsdp_slices(module):
            if not (part.config.tied_head and part.mesh.pp > 1 and piece[0] == "head.proj.weight"):
                yield piece


def _fsdp_slices(fsdp):
    """FSDP's shards cut at its units' layouts (each name's part of this rank's block), and its
    replicated parameters."""
    r = fsdp.comm.rank
    for unit in fsdp.units:
        start, stop = r * unit.block, (r + 1) * unit.block
        for offset, shape, _, name in unit.layout:
            a, b = max(offset, start), min(offset + shape.numel(), stop)
            if a < b:
                view = unit.shard.detach()[a - start : b - start]
                yield name, tuple(shape), view, a - offset, b - offset, unit.shard, (
                    a - start, b - start)  # fmt: skip
    for q, _ in fsdp.replicated:
        yield fsdp.names[id(q)], tuple(q.shape), q, 0, q.numel(), q, None


def stage_names(spec, mesh) -> list[str]:
    """The dense names a rank of `mesh` holds (its pipeline stages' blocks, the embedding on the
    first stage, the head on the last; a tied head's last stage reads the embedding too)."""
    n_layers = spec.model.n_layers
    virtual = 2 if spec.schedule == "interleaved" and mesh.pp > 1 else 1
    n_stages = mesh.pp * virtual
    stages = [c * mesh.pp + mesh.pp_rank for c in range(virtual)]
    blocks = {i for s in stages for i in stage_blocks(n_layers, n_stages, s)}
    names = []
    for name in sharding.dense_shapes(spec.model):
        head = name.startswith("head.") or (
            spec.model.tied_head and name == "embed.tok.weight" and n_stages - 1 in stages
        )
        if name.startswith("blocks."):
            keep = int(name.split(".")[1]) in blocks
        else:
            keep = (name.startswith("embed.") and 0 in stages) or (head and n_stages - 1 in stages)
        if keep:
            names.append(name)
    return names


def span(cut: str | None, dense_shape, p: int, q: int) -> tuple[int, int, int]:
    """(dim, start, stop) of piece q of p in the dense tensor's coordinates (qkv: within each of
    q, k and v; vocab: the padding rows left out); a whole tensor (cut None) is one piece."""
    if cut is None:
        return 0, 0, dense_shape[0] if dense_shape else 1
    dim = 1 if cut == "cols" else 0
    n = dense_shape[dim] // 3 if cut == "qkv" else dense_shape[dim]
    width = plan.padded_vocab(n, p, sharding.VOCAB_MULTIPLE) if cut == "vocab" else n
    step = -(-width // p)
    return dim, min(q * step, n), min((q + 1) * step, n)


def needed(cut, dense_shape, old_p: int, new_p: int, new_q: int) -> list[int]:
    """The old pieces (of old_p) that overlap new piece new_q of new_p: the only ones read (a
    whole tensor: its one piece)."""
    if cut is None:
        return [0]
    _, a, b = span(cut, dense_shape, new_p, new_q)
    spans = [span(cut, dense_shape, old_p, q) for q in range(old_p)]
    return [q for q, (_, c, d) in enumerate(spans) if max(a, c) < min(b, d)]


def place(full: torch.Tensor, piece: torch.Tensor, cut, p: int, q: int) -> None:
    """Write cut piece q of p into the dense tensor `full` (the inverse of plan.shard, for one
    piece)."""
    if cut is None:
        full.copy_(piece)
        return
    dim, a, b = span(cut, full.shape, p, q)
    if cut == "qkv":
        three = full.view(3, full.shape[0] // 3, *full.shape[1:])
        three[:, a:b].copy_(piece.view(3, -1, *full.shape[1:])[:, : b - a])
    else:
        full.narrow(dim, a, b - a).copy_(piece.narrow(dim, 0, b - a))


def assemble(entries, dense_shape, reader, new_p: int, new_q: int) -> torch.Tensor:
    """The dense tensor with every position of new piece new_q of new_p filled, from the saved
    `entries` of one (kind, name) (their metas) and reader(meta) -> the saved flat tensor.
    Only the old pieces overlapping the new one are read; the rest of it stays zero."""
    cut, old_p = entries[0]["cut"], entries[0]["p"]
    full = torch.zeros(dense_shape, dtype=torch.float32)
    by_piece = {}
    for meta in entries:
        by_piece.setdefault(meta["q"], []).append(meta)
    for q in needed(cut, dense_shape, old_p, new_p, new_q):
        metas = by_piece.get(q, [])
        shape = metas[0]["shape"] if metas else None
        flat = torch.zeros(torch.Size(shape).numel() if shape else 0, dtype=torch.float32)
        covered = 0
        for meta in metas:
            flat[meta["lo"] : meta["hi"]] = reader(meta).reshape(-1).float()
            covered += meta["hi"] - meta["lo"]
        if not metas or covered != flat.numel():
            name = entries[0]["name"]
            raise ValueError(f"checkpoint lacks part of piece {q} of {name} ({entries[0]['kind']})")
        place(full, flat.view(shape), cut, old_p, q)
    return full
