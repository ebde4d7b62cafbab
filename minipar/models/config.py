"""What a training run is, as plain data (no torch): the model's shape and the layout.

    GPTConfig(hidden=64, n_layers=8, n_heads=8)     # the tiny GPT (minipar.models.gpt)
    RunSpec(dp=2, tp=2, pp=2, microbatches=4, model=GPTConfig()).validate()

Kept apart from the model so that `minipar train` can refuse a wrong layout before it starts
any rank or loads torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256  # bytes: the tokenizer of minipar.models.data
    seq_len: int = 64
    hidden: int = 64
    n_layers: int = 8
    n_heads: int = 8
    ffn_hidden: int = 0  # 0: 4 * hidden, as GPT-2
    tied_head: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "hidden", "n_layers", "n_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.ffn_hidden, int) or self.ffn_hidden < 0:
            raise ValueError(
                f"GPTConfig.ffn_hidden must be >= 0 (0: 4*hidden), got {self.ffn_hidden!r}"
            )
        if self.hidden % self.n_heads:
            raise ValueError(
                f"GPTConfig: hidden={self.hidden} is not divisible by n_heads={self.n_heads}"
            )

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    def n_params(self) -> int:
        """Parameters of the model built from this config (a tied head adds none)."""
        h, f, v = self.hidden, self.ffn, self.vocab_size
        block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
        head = 2 * h + (0 if self.tied_head else v * h)
        return v * h + self.seq_len * h + self.n_layers * block + head

    def to_dict(self) -> dict:
        return asdict(self)


SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
RECOMPUTE = ("none", "selective", "full")  # minipar/parallel/recompute.py's policies


@dataclass(frozen=True)
class RunSpec:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1  # per data-parallel rank per step
    schedule: str = "1f1b"
    fsdp: bool = False
    steps: int = 50
    batch_size: int = 8  # sequences per step, all ranks together
    lr: float = 1e-3
    seed: int = 0
    model: GPTConfig = field(default_factory=GPTConfig)
    recompute: str = "none"  # activation recomputation: RECOMPUTE

    def validate(self) -> None:
        """Every problem a layout can have that every rank can see alone (ValueError)."""
        for name in ("dp", "tp", "pp", "microbatches", "steps", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if self.batch_size % (self.dp * self.microbatches):
            raise ValueError(
                f"batch_size={self.batch_size} is not divisible by dp={self.dp} x "
                f"microbatches={self.microbatches}"
            )
        if self.recompute not in RECOMPUTE:
            raise ValueError(
                f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}"
            )
        m = self.model
        if m.n_heads % self.tp:
            raise ValueError(f"n_heads={m.n_heads} is not divisible by tp={self.tp}")
        if m.n_layers % self.pp:
            raise ValueError(f"n_layers={m.n_layers} is not divisible by pp={self.pp}")
        if self.schedule == "interleaved" and self.pp > 1 and m.n_layers % (2 * self.pp):
            raise ValueError(
                f"n_layers={m.n_layers} is not divisible by pp={self.pp} x virtual_stages=2 "
                "(the interleaved schedule's two chunks per rank)"
            )

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.model.seq_len
