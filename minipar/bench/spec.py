"""What a benchmark run measures: collectives, message sizes, dtypes, and the bandwidth factors.

Sizes are whole-buffer bytes, as in minipar.cost and nccl-tests: the vector reduced or broadcast,
the full output of an all-gather, the full input of a reduce-scatter, the root's buffer of a
scatter or gather, one rank's send buffer of an all-to-all.

    parse_sizes("8B:64MiB")        8, 16, 32, ... 64 MiB (doubling)
    parse_sizes("1KiB:1MiB:x4")    1 KiB, 4 KiB, ... 1 MiB
    parse_sizes("8,1MiB,64MiB")    exactly these
"""

from __future__ import annotations

import re

COLLECTIVES = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "scatter",
    "gather",
]
ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all_single": "all_to_all",
    "bcast": "broadcast",
}
# collectives whose buffer is cut into p equal blocks: sizes round up to a multiple of p items
BLOCKED = {"all_gather", "reduce_scatter", "all_to_all", "scatter", "gather"}
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8"]
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8,
            "int8": 1, "uint8": 1}  # fmt: skip

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1000, "KIB": 1 << 10, "M": 1 << 20, "MB": 10**6,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 10**9, "GIB": 1 << 30}  # fmt: skip


def bus_factor(collective: str, p: int) -> float:
    """busbw = algbw * factor (nccl-tests' convention): the fraction of the buffer that crosses
    each rank's link in a bandwidth-optimal algorithm, so busbw is comparable to link speed."""
    if collective == "all_reduce":
        return 2 * (p - 1) / p
    if collective in ("broadcast", "reduce"):
        return 1.0
    return (p - 1) / p  # all_gather, reduce_scatter, all_to_all, scatter, gather


def canonical(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; choose from {', '.join(COLLECTIVES)}")
    return key


def parse_collectives(text: str) -> list[str]:
    """'all_reduce', 'all_reduce,all_gather' or 'all'."""
    if text.strip() == "all":
        return list(COLLECTIVES)
    return list(dict.fromkeys(canonical(part) for part in text.split(",") if part.strip()))


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match and match.group(2).upper()
    if not match or unit not in _UNITS:
        raise ValueError(f"cannot read size {text!r}: use e.g. 8, 8B, 4KiB, 1MiB, 64MiB, 1GB")
    return int(float(match.group(1)) * _UNITS[unit])


def parse_sizes(text: str) -> list[int]:
    """'START:END[:xF]' (a geometric series, factor F, default 2, END always included) or a
    comma-separated list."""
    if ":" not in text:
        sizes = sorted({parse_size(part) for part in text.split(",") if part.strip()})
        if not sizes:
            raise ValueError("no sizes given: use e.g. 8B:64MiB or 8,1MiB,64MiB")
        return sizes
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"cannot read sizes {text!r}: use START:END or START:END:xFACTOR")
    lo, hi = parse_size(parts[0]), parse_size(parts[1])
    factor = float(parts[2].lstrip("xX*")) if len(parts) == 3 else 2.0
    if lo < 1 or hi < lo or factor <= 1:
        raise ValueError(f"sizes {text!r}: need 1 <= START <= END and a factor above 1")
    sizes, n = [], float(lo)
    while n < hi:
        sizes.append(int(n))
        n *= factor
    return sorted(set(sizes + [hi]))


def round_size(collective: str, nbytes: int, p: int, itemsize: int) -> int:
    """nbytes rounded up to whole items, and to p equal blocks where the collective needs it."""
    unit = itemsize * (p if collective in BLOCKED else 1)
    return max(unit, -(-nbytes // unit) * unit)


def format_size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{int(n)} B"
