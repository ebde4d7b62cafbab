"""A link the cost model prices a message on (cost.links holds the presets and the defaults).

Link(name, alpha, beta, gamma, source)     seconds per message, per byte sent, per byte
                                           reduced; `source` says where the numbers are from
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """alpha: seconds per message; beta: seconds per byte sent; gamma: seconds per byte reduced."""

    name: str
    alpha: float
    beta: float
    gamma: float
    source: str = ""
