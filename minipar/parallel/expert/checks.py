"""Bad input, found on every rank before any token moves.

A layer's shape must be the same on every rank of its expert-parallel group: a rank that
thought there were 3 experts would send blocks to the wrong ranks. So `MoE` first gathers
every rank's (n_experts, hidden, ffn_hidden, top_k, capacity_factor) with one
`all_gather_object` (two small all-gathers, once per layer built), then every rank runs the same
checks on the same list and raises the same ValueError. Per forward, the input's hidden size and
dtype ride in the count exchange (exchange.py) and are checked the same way, before the tokens
are sent.
"""

from __future__ import annotations

import numbers

from minipar.parallel.expert.exchange import dtype_code, dtype_name

FIELDS = ("n_experts", "hidden", "ffn_hidden", "top_k", "capacity_factor")


def config(n_experts, hidden, ffn_hidden, top_k, capacity_factor) -> dict:
    return dict(zip(FIELDS, (n_experts, hidden, ffn_hidden, top_k, capacity_factor)))


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_config(configs: list, where: str = "MoE") -> None:
    """configs: every rank's config() in rank order (one entry: a single process)."""
    for name in FIELDS:
        values = [c[name] for c in configs]
        if any(v != values[0] for v in values):
            said = ", ".join(f"rank {q} has {v!r}" for q, v in enumerate(values))
            raise ValueError(f"{where}: the ranks disagree on {name}: {said}")
    c, p = configs[0], len(configs)
    for name in ("n_experts", "hidden", "ffn_hidden"):
        if not _positive_int(c[name]):
            raise ValueError(f"{where}: {name}={c[name]!r} must be a positive int")
    if not isinstance(c["top_k"], int) or not 1 <= c["top_k"] <= c["n_experts"]:
        raise ValueError(
            f"{where}: top_k={c['top_k']!r} must be an int from 1 to n_experts={c['n_experts']}"
        )
    cf = c["capacity_factor"]
    if cf is not None and (isinstance(cf, bool) or not isinstance(cf, numbers.Real) or not cf > 0):
        raise ValueError(
            f"{where}: capacity_factor={cf!r} must be a positive number, or None (dropless)"
        )
    if c["n_experts"] % p:
        raise ValueError(
            f"{where}: n_experts={c['n_experts']} is not divisible by the expert-parallel "
            f"group size {p}"
        )


def check_inputs(rows, hidden: int, dtype, where: str = "MoE") -> None:
    """rows: the count exchange's (p, 3 + 2E) gather, its first two columns every rank's input
    hidden size and dtype code (exchange.py); raise on every rank if any rank's was not the
    layer's `hidden` and (torch) `dtype`."""
    bad = [(q, h) for q, h in enumerate(rows[:, 0].tolist()) if h != hidden]
    if bad:
        said = ", ".join(f"rank {q} passed {h}" for q, h in bad)
        raise ValueError(f"{where}: the input's last dimension must be hidden={hidden}: {said}")
    dtype, names = dtype_name(dtype_code(dtype)), [dtype_name(c) for c in rows[:, 1].tolist()]
    bad = [(q, d) for q, d in enumerate(names) if d != dtype]
    if bad:
        said = ", ".join(f"rank {q} passed {d}" for q, d in bad)
        raise ValueError(f"{where}: the input's dtype must be the layer's {dtype}: {said}")
