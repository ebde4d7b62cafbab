"""The arguments of ring_attention and ulysses_attention, checked on every rank before any K/V
byte moves.

Each rank describes its q, k and v (shape, dtype, device type: a few dozen bytes) and the group
all-gathers the descriptions (one small all_gather_object, the only message before the data).
Every rank then runs the same checks on the same list, so a bad shard on one rank raises the
same ValueError on all of them, instead of leaving the others waiting for K/V that never come:

    each rank's q, k and v:  tensors, 4-D (batch, heads, local_seq, head_dim), floating point,
                             one shape, one dtype, one device type
    across the ranks:        the same description everywhere
    the layout:              causal=True (load-balanced) needs an even local_seq (2cp chunks)
    Ulysses:                 heads divisible by cp
"""

from __future__ import annotations

import torch

from minipar import collectives, runtime

NAMES = ("q", "k", "v")


def describe(t):
    """(shape, dtype, device type) of a tensor, or the type's name of anything else."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return (tuple(t.shape), str(t.dtype).replace("torch.", ""), t.device.type)


def _own_problem(desc) -> str | None:
    """What is wrong with one rank's (q, k, v) descriptions on their own, or None."""
    for name, d in zip(NAMES, desc):
        if isinstance(d, str):
            return f"{name} is a {d}, not a torch.Tensor"
        if len(d[0]) != 4:
            return f"{name} has shape {d[0]}: expected (batch, heads, local_seq, head_dim)"
        if not torch.empty(0, dtype=getattr(torch, d[1])).is_floating_point():
            return f"{name} has dtype {d[1]}: attention needs a floating-point dtype"
    (qs, qt, qd), rest = desc[0], desc[1:]
    for name, (shape, dtype, device) in zip(NAMES[1:], rest):
        if shape != qs:
            return f"q has shape {qs} but {name} has shape {shape}: q, k and v must agree"
        if dtype != qt or device != qd:
            return f"q is {qt} on {qd} but {name} is {dtype} on {device}: q, k and v must agree"
    return None


def _problem(seen, cp: int, causal: bool, balanced: bool, variant: str) -> str | None:
    for rank, desc in enumerate(seen):
        own = _own_problem(desc)
        if own:
            return f"on rank {rank}, {own}"
    if any(desc != seen[0] for desc in seen):
        i = next(i for i in range(3) if any(d[i] != seen[0][i] for d in seen))  # q, k or v
        listed = "; ".join(f"rank {r}: {d[i][0]} {d[i][1]}" for r, d in enumerate(seen))
        return (
            f"the ranks pass shards of different shapes or dtypes ({NAMES[i]}: {listed}); every "
            "rank of the context-parallel group must pass the same (batch, heads, local_seq, "
            "head_dim) and dtype"
        )
    _, heads, local_seq, _ = seen[0][0][0]
    if causal and balanced and cp > 1 and local_seq % 2:
        return (
            f"causal=True takes the load-balanced layout: the full sequence of cp x local_seq = "
            f"{cp} x {local_seq} = {cp * local_seq} tokens must divide into 2cp = {2 * cp} chunks "
            f"(local_seq {local_seq} is odd; shard_sequence(x, dim, group, causal=True) cuts it)"
        )
    if variant == "ulysses_attention" and heads % cp:
        return (
            f"Ulysses splits the heads over the group: heads = {heads} is not divisible by "
            f"cp = {cp}"
        )
    return None


def check_attention_inputs(q, k, v, group, causal: bool, balanced: bool, variant: str):
    """(cp, rank) of the group, once every rank agrees that the arguments are good; else the
    same ValueError on every rank, naming the bad values."""
    cp, rank = runtime.get_world_size(group), runtime.get_rank(group)
    mine = tuple(describe(t) for t in (q, k, v))
    seen = [mine]
    if cp > 1:
        seen = [None] * cp
        collectives.all_gather_object(seen, mine, group=group)
    problem = _problem(seen, cp, causal, balanced, variant)
    if problem:
        raise ValueError(f"{variant}: {problem}")
    return cp, rank
