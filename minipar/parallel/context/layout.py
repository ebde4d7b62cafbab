"""Which tokens each rank of a context-parallel group holds: the contiguous and the load-balanced
layout, and the two functions that cut a full tensor and join it back.

    shard = shard_sequence(x, dim=2, group=cp_group, causal=True)    # this rank's tokens
    full = unshard_sequence(shard, dim=2, group=cp_group, causal=True)

Contiguous (causal=False): S tokens cut into cp blocks, rank r holds block r.

    S = 8, cp = 2     rank 0: 0 1 2 3          rank 1: 4 5 6 7

Load-balanced (causal=True): S tokens cut into 2cp chunks, rank r holds chunk r (the head) and
chunk 2cp-1-r (the tail), in that order (torchtitan's and Megatron's head-tail split).

    S = 8, cp = 2     chunks [0 1][2 3][4 5][6 7]      rank 0: [0 1][6 7]   rank 1: [2 3][4 5]

Why: under a causal mask query i attends keys 0..i, so with contiguous blocks rank r's queries
need the keys of ranks 0..r: rank cp-1 does cp times the work of rank 0. Pairing an early chunk
with a late one evens it out: chunk i needs i+1 chunks of keys, so rank r needs
(r + 1) + (2cp - r) = 2cp + 1 chunk products, whatever r (lesson 09). Inside a rank the tokens
stay in increasing order, so a plain causal mask on the local block is still right.

With cp = 1 both layouts are the identity (any S). Otherwise S must divide by cp (contiguous)
or 2cp (load-balanced): a ValueError names S, cp and the layout, before anything moves.

What moves: shard_sequence sends nothing (every rank cuts its part of a full tensor it already
has). unshard_sequence is one all-gather of the shards: on the ring each rank sends (cp-1)
shards of N/cp bytes in cp-1 steps, then reorders the chunks locally; the shards' shapes and
dtypes are compared first (a small all_gather_object), so a mismatch fails on every rank.
"""

from __future__ import annotations

import torch

from minipar import collectives, runtime


def chunks_of(rank: int, cp: int, causal: bool) -> tuple[int, ...]:
    """The chunks rank `rank` holds, in order: (rank,) of cp chunks, or (rank, 2cp-1-rank) of 2cp
    chunks for the load-balanced causal layout."""
    if not 0 <= rank < cp:
        raise ValueError(f"rank {rank} is not in a context-parallel group of size {cp}")
    if causal and cp > 1:
        return (rank, 2 * cp - 1 - rank)
    return (rank,)


def n_chunks(cp: int, causal: bool) -> int:
    """How many equal chunks the full sequence is cut into: cp, or 2cp when load-balanced."""
    return 2 * cp if causal and cp > 1 else cp


def check_length(seq_len: int, cp: int, causal: bool, what: str = "the sequence") -> None:
    """ValueError unless seq_len cuts into the layout's equal chunks."""
    chunks = n_chunks(cp, causal)
    if seq_len % chunks:
        layout = (
            f"the load-balanced causal layout cuts it into 2cp = {chunks} chunks"
            if causal and cp > 1
            else f"the contiguous layout cuts it into cp = {chunks} blocks"
        )
        raise ValueError(
            f"{what} has length {seq_len}, which is not divisible by {chunks}: {layout} "
            f"(context-parallel group size cp = {cp})"
        )


def positions(rank: int, cp: int, seq_len: int, causal: bool) -> torch.Tensor:
    """The global positions of the tokens rank `rank` holds, in its local order (int64)."""
    check_length(seq_len, cp, causal)
    size = seq_len // n_chunks(cp, causal)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks_of(rank, cp, causal)])


def gathered_order(cp: int, seq_len: int, causal: bool) -> torch.Tensor:
    """Global positions of the tokens of every rank's shard concatenated in rank order (what an
    all-gather of the shards holds): index i of the gathered tensor is token order[i]."""
    return torch.cat([positions(r, cp, seq_len, causal) for r in range(cp)])


def _dim_of(x, dim: int, what: str) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} takes a torch.Tensor, got {type(x).__name__}")
    if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(
            f"{what}: dim={dim!r} is not a dimension of a tensor of shape {tuple(x.shape)}"
        )
    return dim % x.dim()


def shard_sequence(x: torch.Tensor, dim: int, group=None, causal: bool = False) -> torch.Tensor:
    """This rank's part of the full tensor x along `dim` (the sequence): its contiguous block, or
    with causal=True its head and tail chunks joined. A new contiguous tensor; autograd flows
    through it (no communication)."""
    dim = _dim_of(x, dim, "shard_sequence")
    cp, rank = runtime.get_world_size(group), runtime.get_rank(group)
    check_length(x.shape[dim], cp, causal, f"dimension {dim} of shard_sequence's input")
    size = x.shape[dim] // n_chunks(cp, causal)
    parts = [x.narrow(dim, c * size, size) for c in chunks_of(rank, cp, causal)]
    return torch.cat(parts, dim=dim) if len(parts) > 1 else parts[0].contiguous()


def unshard_sequence(x: torch.Tensor, dim: int, group=None, causal: bool = False) -> torch.Tensor:
    """The full tensor from every rank's shard along `dim`, tokens back in their global order
    (the inverse of shard_sequence with the same causal flag). One all-gather; outside autograd
    (the result is detached)."""
    dim = _dim_of(x, dim, "unshard_sequence")
    cp = runtime.get_world_size(group)
    mine = (tuple(x.shape), str(x.dtype).replace("torch.", ""), x.device.type)
    seen = [mine] if cp == 1 else [None] * cp
    if cp > 1:
        collectives.all_gather_object(seen, mine, group=group)
    if any(s != seen[0] for s in seen):
        listed = ", ".join(f"rank {r}: {s[0]} {s[1]} on {s[2]}" for r, s in enumerate(seen))
        raise ValueError(
            f"unshard_sequence: the ranks' shards differ ({listed}); every rank must pass its "
            "shard of the same full tensor"
        )
    if cp == 1:
        return x.detach().clone()
    check_length(cp * x.shape[dim], cp, causal, f"the full dimension {dim} (cp x {x.shape[dim]})")
    front = x.detach().movedim(dim, 0).contiguous()  # minipar gathers flat blocks: dim outermost
    out = front.new_empty((cp * front.shape[0], *front.shape[1:]))
    collectives.all_gather_into_tensor(out, front, group=group)
    if causal:  # the gathered chunks are (0, 2cp-1), (1, 2cp-2), ...: sort them back
        order = torch.argsort(gathered_order(cp, out.shape[0], causal)).to(out.device)
        out = out.index_select(0, order)
    return out.movedim(0, dim).contiguous()
