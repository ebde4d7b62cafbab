"""Clusters as data: GPUs per node, the link inside a node, the network between nodes, NICs.

    Cluster(name, per_node, intra, inter, nics)

`intra` and `inter` are minipar.cost Links (alpha seconds per message, beta seconds per byte in
one direction); `nics` NICs per node, rank l of a node uses NIC l mod nics, so ranks beyond the
NICs share one. Each figure's source is in docs/simulate.md; the links are minipar.cost's
presets, so the simulator and the cost model price a message alike.

    h100   DGX H100: 8 GPUs, NVLink 4 through NVSwitch (450 GB/s each way per GPU),
           8 ConnectX-7 InfiniBand NDR NICs (400 Gb/s = 50 GB/s each way), one per GPU
    b200   DGX B200: 8 GPUs, NVLink 5 (900 GB/s each way per GPU), 8 NDR NICs
    pcie   a PCIe box: 8 GPUs on PCIe 5.0 x16 (64 GB/s each way), one NDR NIC for the node

`parse_link("alpha=5us,bw=25GB/s")` and `custom(...)` give a cluster of one link class.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from minipar.cost.links import IB_NDR, NVLINK4, NVLINK5, PCIE5, Link


@dataclass(frozen=True)
class Cluster:
    name: str
    per_node: int
    intra: Link
    inter: Link
    nics: int

    def describe(self) -> str:
        return (
            f"{self.name}: {self.per_node} ranks a node; inside {_rate(self.intra)}, across "
            f"{self.nics} NIC(s) a node of {_rate(self.inter)}"
        )

    def with_per_node(self, per_node: int) -> Cluster:
        """The same links with `per_node` ranks a node (the NICs stay: ranks may share them)."""
        check_count(per_node, "ranks per node")
        return replace(self, per_node=per_node)


def _rate(link: Link) -> str:
    return f"{1 / link.beta / 1e9:g} GB/s, {link.alpha * 1e6:g} us"


PRESETS = {
    "h100": Cluster("h100", 8, NVLINK4, IB_NDR, 8),
    "b200": Cluster("b200", 8, NVLINK5, IB_NDR, 8),
    "pcie": Cluster("pcie", 8, PCIE5, IB_NDR, 1),
}

_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_RATES = {"b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12}


def preset(name: str) -> Cluster:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown cluster {name!r}; choose one of {', '.join(PRESETS)} or give --link"
        ) from None


def parse_link(text: str) -> Link:
    """'alpha=5us,bw=25GB/s' (also alpha=5e-6, bw=25e9 in bytes/s, or Gbit/s) -> a Link."""
    fields = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in ("alpha", "bw"):
            raise ValueError(f"--link {text!r}: expected alpha=..,bw=.. (e.g. alpha=5us,bw=25GB/s)")
        fields[key.strip()] = value.strip()
    if set(fields) != {"alpha", "bw"}:
        raise ValueError(f"--link {text!r}: give both alpha and bw")
    alpha, bw = _seconds(fields["alpha"], text), _bytes_per_second(fields["bw"], text)
    return Link("custom", alpha, 1 / bw, 0.0, f"--link {text}")


def _seconds(value: str, text: str) -> float:
    m = re.fullmatch(r"([0-9.eE+-]+)\s*(s|ms|us|ns|)", value)
    try:
        seconds = float(m.group(1)) * _UNITS[m.group(2)] if m else -1.0
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"--link {text!r}: alpha {value!r} must be >= 0 seconds (5us, 2e-6)")
    return seconds


def _bytes_per_second(value: str, text: str) -> float:
    m = re.fullmatch(r"([0-9.eE+-]+)\s*([kmgt]?b/s|[kmgt]?bit/s|)", value.lower())
    rate = -1.0
    if m:
        try:
            rate = float(m.group(1))
        except ValueError:
            rate = -1.0
        unit = m.group(2)
        if unit.endswith("bit/s"):
            rate *= _RATES[unit[:-5] + "b/s"] / 8
        elif unit:
            rate *= _RATES[unit]
    if not rate > 0 or rate == float("inf"):
        raise ValueError(
            f"--link {text!r}: bw {value!r} must be a positive rate (25GB/s, 400Gbit/s)"
        )
    return rate


def custom(link: Link, per_node: int, nics: int | None = None) -> Cluster:
    """One link class inside and across nodes (the closed forms' world), a NIC per rank."""
    check_count(per_node, "ranks per node")
    return Cluster("custom", per_node, link, link, nics or per_node)


def check_count(n, what: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
