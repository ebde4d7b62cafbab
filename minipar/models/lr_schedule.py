"""The learning rate at every step: a linear warm-up, then a cosine or linear decay to a floor,
or constant. Data and one function; the optimizer's lr is set from it before each step.

    s = LRSchedule(peak=1e-3, warmup=5, kind="cosine", floor=1e-4, total=50)
    s.at(0), s.at(4), s.at(5), s.at(49)   # 2e-4, 1e-3 (warm), 1e-3 (decay begins), ~1e-4

    step < warmup:     peak * (step + 1) / warmup               (the first step is not 0)
    decay, p = (step - warmup) / (total - warmup) in [0, 1):
      cosine:          floor + (peak - floor) * (1 + cos(pi p)) / 2
      linear:          peak - (peak - floor) * p
      constant:        peak
    step >= total:     floor (constant: peak)

The step is the global one (a resumed run continues the count), and `total` the run's last
step + 1 unless given (--decay-steps): a run that is saved and resumed takes the same rates as
one that is not when the schedule says where it ends. nanotron, Megatron-LM and CS336's
assignment use this shape (warm-up, then cosine to a minimum).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

KINDS = ("cosine", "linear", "constant")


@dataclass(frozen=True)
class LRSchedule:
    peak: float
    warmup: int = 0
    kind: str = "constant"
    floor: float = 0.0
    total: int = 1

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"lr schedule must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for name in ("warmup", "total"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not 0 <= self.floor <= self.peak:
            raise ValueError(f"min lr {self.floor!r} must lie in 0 .. lr={self.peak!r}")

    def at(self, step: int) -> float:
        """The learning rate of global step `step` (0-based)."""
        if step < self.warmup:
            return self.peak * (step + 1) / self.warmup
        if self.kind == "constant":
            return self.peak
        span = self.total - self.warmup
        if span <= 0 or step >= self.total:
            return self.floor
        p = (step - self.warmup) / span
        if self.kind == "cosine":
            return self.floor + (self.peak - self.floor) * (1 + math.cos(math.pi * p)) / 2
        return self.peak - (self.peak - self.floor) * p

    def to_dict(self) -> dict:
        return asdict(self)


def set_lr(optimizer, lr: float) -> None:
    """Every parameter group of `optimizer` at rate `lr`."""
    for group in optimizer.param_groups:
        group["lr"] = lr
