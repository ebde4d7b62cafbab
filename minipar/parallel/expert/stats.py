"""Load statistics of one MoE forward: how many copies each expert and each rank got, and how
many were dropped. Built from the count exchange, so every rank of the group holds the whole
layer's numbers without another message (`moe.last_stats`).

    experts [40, 12, 8, 4] (max/mean 2.50)   ranks [52, 12]   dropped 9 of 64 copies

`imbalance` is the busiest expert's copies over the mean (1 when balanced, E when a top-1 router
sends everything to one expert): the slowest expert sets the layer's time, so a layer with
imbalance 2.5 takes as long as one with 2.5 times the tokens, balanced.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoadStats:
    routed: tuple  # (groups, E): copies each group (rank) routed to each expert, before capacity
    kept: tuple  # (groups, E): the copies that fit (= routed when dropless)
    tokens: tuple  # (groups,): tokens of each group
    capacity: tuple  # (groups,): C of each group, or None entries when dropless
    top_k: int

    @property
    def tokens_per_expert(self) -> list:
        """Copies routed to each expert, summed over the groups (before capacity)."""
        return [sum(col) for col in zip(*self.routed)]

    @property
    def kept_per_expert(self) -> list:
        return [sum(col) for col in zip(*self.kept)]

    def tokens_per_rank(self, n_ranks: int) -> list:
        """Kept copies each rank's experts process (rank q owns a contiguous E/n_ranks block)."""
        per = self.kept_per_expert
        width = len(per) // n_ranks
        return [sum(per[q * width : (q + 1) * width]) for q in range(n_ranks)]

    @property
    def dropped(self) -> int:
        return sum(r - k for rr, kk in zip(self.routed, self.kept) for r, k in zip(rr, kk))

    @property
    def copies(self) -> int:
        return self.top_k * sum(self.tokens)

    @property
    def imbalance(self) -> float:
        per = self.tokens_per_expert
        return max(per) * len(per) / sum(per) if sum(per) else 1.0

    def summary(self, n_ranks: int = 1) -> str:
        return (
            f"experts {self.tokens_per_expert} (max/mean {self.imbalance:.2f})   "
            f"ranks {self.tokens_per_rank(n_ranks)}   "
            f"dropped {self.dropped} of {self.copies} copies"
        )


def from_counts(tokens, routed, kept, capacity, top_k: int) -> LoadStats:
    """From per-group lists (plain ints)."""
    return LoadStats(
        _rows(routed), _rows(kept), tuple(int(t) for t in tokens), tuple(capacity), top_k
    )


def _rows(matrix) -> tuple:
    return tuple(tuple(int(v) for v in row) for row in matrix)
