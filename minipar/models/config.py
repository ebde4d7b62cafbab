"""What a training run is, as plain data (no torch): the model's shape and the layout.

    GPTConfig(hidden=64, n_layers=8, n_heads=8)     # the tiny GPT (minipar.models.gpt)
    GPTConfig(n_experts=4, top_k=2)                 # every other block's MLP a mixture of 4
    RunSpec(dp=2, tp=2, pp=2, microbatches=4, model=GPTConfig()).validate()
    RunSpec(dp=2, cp=2, cp_variant="ulysses").validate()       # the sequence over 2 ranks
    RunSpec(dp=4, ep=2, model=GPTConfig(n_experts=4)).validate()  # experts over 2 of the dp

Kept apart from the model so that `minipar train` can refuse a wrong layout before it starts
any rank or loads torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from minipar.models.lr_schedule import LRSchedule


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256  # bytes: the tokenizer of minipar.models.data
    seq_len: int = 64
    hidden: int = 64
    n_layers: int = 8
    n_heads: int = 8
    ffn_hidden: int = 0  # 0: 4 * hidden, as GPT-2
    tied_head: bool = False
    n_experts: int = 0  # 0: dense; E > 0: the MLP of every other block is a mixture of E
    top_k: int = 2  # experts per token in those blocks

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
        if isinstance(self.n_experts, bool) or not isinstance(self.n_experts, int):
            raise ValueError(f"GPTConfig.n_experts must be an int >= 0, got {self.n_experts!r}")
        if self.n_experts < 0 or (self.n_experts and not 1 <= self.top_k <= self.n_experts):
            raise ValueError(
                f"GPTConfig: n_experts={self.n_experts} with top_k={self.top_k}: n_experts must "
                "be >= 0 (0: dense) and top_k from 1 to n_experts"
            )

    def is_moe(self, block: int) -> bool:
        """Whether block `block`'s MLP is a mixture of experts: every other block (1, 3, 5, ...,
        as Switch and GShard alternate dense and expert layers), when n_experts > 0."""
        return self.n_experts > 0 and block % 2 == 1

    @property
    def moe_blocks(self) -> list[int]:
        return [i for i in range(self.n_layers) if self.is_moe(i)]

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    def n_params(self) -> int:
        """Parameters of the model built from this config (a tied head adds none; an MoE block
        has E experts' MLPs and a router, E x hidden, instead of one MLP)."""
        h, f, v, e = self.hidden, self.ffn, self.vocab_size, self.n_experts
        mlp = (h * f + f) + (f * h + h)
        block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + mlp
        moe = len(self.moe_blocks) * ((e - 1) * mlp + e * h)
        head = 2 * h + (0 if self.tied_head else v * h)
        return v * h + self.seq_len * h + self.n_layers * block + moe + head

    def to_dict(self) -> dict:
        return asdict(self)


SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
RECOMPUTE = ("none", "selective", "full")  # minipar/parallel/recompute.py's policies
CP_VARIANTS = ("ring", "ulysses")


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
    cp: int = 1  # context parallel: the sequence over cp ranks (load-balanced causal layout)
    cp_variant: str = "ring"  # "ring" (K/V around the ring) or "ulysses" (all-to-all to heads)
    ep: int = 1  # expert parallel: the experts over ep of the dp ranks (ep divides dp)
    dtype: str = "fp32"  # compute precision (models/precision.py): fp32, bf16 or fp16
    reduce_dtype: str = "fp32"  # the data-parallel gradient reduction: fp32 or bf16
    clip: float | None = None  # clip the whole model's gradient norm to this (None: no clip)
    warmup: int = 0  # learning-rate warm-up steps (models/lr_schedule.py)
    lr_schedule: str = "constant"  # after the warm-up: cosine, linear or constant
    min_lr: float = 0.0  # the decay's floor
    decay_steps: int | None = None  # the step the decay ends at (None: the run's last + 1)
    # hybrid sharding (with fsdp): FSDP inside groups of dp_shard consecutive dp ranks (a node's),
    # replicated over the dp / dp_shard groups; 0: sharded over every dp rank
    dp_shard: int = 0

    @property
    def ranks(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def _validate_hybrid(self) -> None:
        s = self.dp_shard
        if s == 0:
            return
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"dp_shard must be a positive integer, got {s!r}")
        if not self.fsdp:
            raise ValueError(f"dp_shard={s} needs fsdp (hybrid sharding is FSDP's)")
        if self.dp % s:
            raise ValueError(f"dp={self.dp} is not divisible by dp_shard={s}")
        if self.cp > 1:
            raise ValueError(
                f"dp_shard={s} with cp={self.cp}: hybrid sharding over dp x cp is not built "
                "yet; use --fsdp (sharded over every dp x cp rank)"
            )

    def validate(self) -> None:
        """Every problem a layout can have that every rank can see alone (ValueError)."""
        for name in ("dp", "tp", "pp", "cp", "ep", "microbatches", "steps", "batch_size"):
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
        self._validate_hybrid()
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
        self._validate_cp()
        self._validate_ep()
        self._validate_training()

    def _validate_training(self) -> None:
        if self.dtype not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"dtype must be fp32, bf16 or fp16, got {self.dtype!r}")
        if self.reduce_dtype not in ("fp32", "bf16"):
            raise ValueError(f"reduce dtype must be fp32 or bf16, got {self.reduce_dtype!r}")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"clip must be a positive number, got {self.clip!r}")
        d = self.decay_steps
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise ValueError(f"decay steps must be a positive integer (or None), got {d!r}")
        self.lr_at(0)  # the schedule's own checks

    def lr_at(self, step: int, start: int = 0) -> float:
        """The learning rate of global step `step` for a run starting at `start`."""
        total = self.decay_steps if self.decay_steps is not None else start + self.steps
        sched = LRSchedule(self.lr, self.warmup, self.lr_schedule, self.min_lr, total)
        return sched.at(step)

    def _validate_cp(self) -> None:
        m = self.model
        if self.cp_variant not in CP_VARIANTS:
            raise ValueError(
                f"cp_variant must be one of {', '.join(CP_VARIANTS)}, got {self.cp_variant!r}"
            )
        if self.cp == 1:
            return
        if m.seq_len % (2 * self.cp):
            raise ValueError(
                f"seq_len={m.seq_len} is not divisible by 2cp = {2 * self.cp}: the load-balanced "
                f"causal layout cuts the sequence into 2cp chunks (cp={self.cp})"
            )
        local = m.n_heads // self.tp
        if self.cp_variant == "ulysses" and local % self.cp:
            raise ValueError(
                f"--cp-variant ulysses splits each rank's n_heads/tp = {m.n_heads}/{self.tp} = "
                f"{local} heads over cp={self.cp}: not divisible (choose the ring, or cp "
                f"dividing {local})"
            )
        if self.pp > 1 and self.schedule == "zb-h1":
            raise ValueError(
                "--cp with schedule zb-h1: zb-h1 computes a stage's input and weight gradients "
                "in two passes, and each would run the attention's backward messages again; "
                "choose gpipe, 1f1b or interleaved"
            )

    def _validate_ep(self) -> None:
        m = self.model
        if self.dp % self.ep:
            raise ValueError(
                f"ep={self.ep} must divide dp={self.dp}: the experts are sharded over the "
                "data-parallel ranks"
            )
        if not m.n_experts:
            if self.ep > 1:
                raise ValueError(f"ep={self.ep} needs a mixture of experts (--moe --experts E)")
            return
        if m.n_experts % self.ep:
            raise ValueError(f"n_experts={m.n_experts} is not divisible by ep={self.ep}")
        if self.fsdp:
            raise ValueError(
                "--moe with --fsdp: FSDP would shard and average the experts over every dp rank, "
                "while each expert lives on its expert-parallel rank and is reduced over the "
                "ranks that share it; use DDP (the default) with --moe"
            )
        if self.pp > 1 and self.schedule == "zb-h1":
            raise ValueError(
                "--moe with schedule zb-h1: zb-h1 computes a stage's input and weight gradients "
                "in two passes, and each would run the experts' all-to-alls again; choose "
                "gpipe, 1f1b or interleaved"
            )

    @property
    def layout(self) -> str:
        """ "dp=2 x tp=2 x pp=2" and the cp and ep degrees when they are not 1."""
        text = f"dp={self.dp}" + (f" x cp={self.cp}" if self.cp > 1 else "")
        return text + f" x tp={self.tp} x pp={self.pp}" + (f", ep={self.ep}" if self.ep > 1 else "")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.model.seq_len
