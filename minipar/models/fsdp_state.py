"""FSDP's flat shards seen by dense parameter name: for gathering weights and AdamW's state into
a dense checkpoint, and for slicing a checkpoint's state back into this rank's shards.

    pieces = by_name(fsdp, lambda q: opt.state[q]["exp_avg"])   # collective over fsdp's group
    load_shards(fsdp, opt, states, tp_rank, tp)                  # no communication

A sharding unit keeps block r of its parameters' flat vector (unit.layout: offset, shape and
name of each). `by_name` all-gathers the blocks ((p-1)/p of the unit's bytes received per rank)
and cuts the vector at the layout's offsets; `load_shards` builds the same vector from the
dense tensors (each sliced for this tp rank first) and keeps block r.
"""

from __future__ import annotations

import torch

from minipar import collectives
from minipar.models import sharding


def by_name(fsdp, value_of) -> dict[str, torch.Tensor]:
    """{dense name: value_of(parameter) un-sharded} for every parameter `fsdp` wraps."""
    out = {}
    for unit in fsdp.units:
        block = value_of(unit.shard).detach().float().contiguous()
        full = block.new_empty(block.numel() * fsdp.comm.size)
        collectives.all_gather_into_tensor(full, block, group=fsdp.comm)
        for offset, shape, _, name in unit.layout:
            out[name] = full[offset : offset + shape.numel()].view(shape).clone()
    for q, _ in fsdp.replicated:
        out[fsdp.names[id(q)]] = value_of(q).detach().clone()
    return out


def load_shards(fsdp, opt, states: dict, tp_rank: int, tp: int, alias=lambda name: name) -> None:
    """opt.state of every shard (and replicated parameter) from `states`, AdamW's state by dense
    name; alias(name) is the name whose state a parameter takes (a tied copy's)."""
    r = fsdp.comm.rank
    for unit in fsdp.units:
        record = {}
        for key in ("exp_avg", "exp_avg_sq"):
            flat = torch.zeros(unit.block * fsdp.comm.size, device=unit.shard.device)
            for offset, shape, _, name in unit.layout:
                piece = sharding.shard(name, states[alias(name)][key], tp_rank, tp)
                flat[offset : offset + shape.numel()] = piece.reshape(-1).to(flat.device)
            record[key] = flat[r * unit.block : (r + 1) * unit.block].clone()
        record["step"] = states[alias(unit.layout[0][3])]["step"].clone()
        opt.state[unit.shard] = record
    for q, _ in fsdp.replicated:
        name = fsdp.names[id(q)]
        dense = states[alias(name)]
        opt.state[q] = {
            k: v.clone() if k == "step" else sharding.shard(name, v, tp_rank, tp).to(q.device)
            for k, v in dense.items()
        }
