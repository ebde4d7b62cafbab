"""Cut an nn.Sequential into pipeline stages that share the model's own layers (no copies).

    stages = split(model, 4)                 # balanced by parameter count
    stages = split(model, 4, balance=[3, 2, 2, 1])   # layer counts per stage

Nothing moves: each stage is an nn.Sequential holding the same layer objects as `model`, so a
gradient computed in a stage lands in the model's own parameters.
"""

from __future__ import annotations


def split(model, n_stages: int, balance=None) -> list:
    """`n_stages` consecutive slices of `model`, each an nn.Sequential of the model's layers.

    Without `balance`, the cut points make each stage's parameter count as close as possible to
    an even share (every stage gets at least one layer); with it, stage i gets balance[i] layers.
    """
    import torch.nn as nn

    if not isinstance(model, nn.Sequential):
        raise TypeError(f"split needs an nn.Sequential, got {type(model).__qualname__}")
    layers = list(model)
    if not isinstance(n_stages, int) or isinstance(n_stages, bool) or n_stages < 1:
        raise ValueError(f"n_stages must be a positive int, got {n_stages!r}")
    if n_stages > len(layers):
        raise ValueError(
            f"cannot split a model of {len(layers)} layers into {n_stages} stages: "
            "every stage needs at least one layer"
        )
    counts = _check_balance(balance, n_stages, len(layers)) if balance is not None else None
    counts = counts or _balanced_counts([_n_params(layer) for layer in layers], n_stages)
    stages, start = [], 0
    for count in counts:
        stages.append(nn.Sequential(*layers[start : start + count]))
        start += count
    return stages


def _n_params(layer) -> int:
    return sum(p.numel() for p in layer.parameters())


def _check_balance(balance, n_stages: int, n_layers: int) -> list[int]:
    counts = list(balance)
    if len(counts) != n_stages:
        raise ValueError(f"balance {counts} has {len(counts)} entries for {n_stages} stages")
    if any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in counts):
        raise ValueError(f"balance {counts} must hold positive ints (layers per stage)")
    if sum(counts) != n_layers:
        raise ValueError(f"balance {counts} sums to {sum(counts)}, the model has {n_layers} layers")
    return counts


def _balanced_counts(sizes: list[int], n_stages: int) -> list[int]:
    """Layer counts per stage minimising the largest stage's parameter count (binary search on
    that bound, greedy fill); ties and parameter-free layers fall back to even layer counts."""
    total = sum(sizes)
    if total == 0:
        base, extra = divmod(len(sizes), n_stages)
        return [base + (i < extra) for i in range(n_stages)]
    lo, hi = max(sizes), total
    while lo < hi:
        mid = (lo + hi) // 2
        if _greedy(sizes, n_stages, mid) is not None:
            hi = mid
        else:
            lo = mid + 1
    return _greedy(sizes, n_stages, lo)


def _greedy(sizes: list[int], n_stages: int, bound: int):
    """Fill stages left to right up to `bound` parameters, leaving one layer for each stage
    still to come; the counts, or None if `bound` is too small."""
    counts, i, n = [], 0, len(sizes)
    for stage in range(n_stages):
        left_after = n_stages - stage - 1
        take, load = 0, 0
        while i + take < n - left_after and (take == 0 or load + sizes[i + take] <= bound):
            if stage == n_stages - 1:  # the last stage takes the rest
                take, load = n - i, sum(sizes[i:])
                break
            load += sizes[i + take]
            take += 1
        if load > bound:
            return None
        counts.append(take)
        i += take
    return counts if i == n else None
