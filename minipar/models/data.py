"""The training data: two Shakespeare plays shipped with the package, read as bytes.

    tokens = load_tokens()                         # int64 tensor, one token per byte
    batches = Batches(tokens, batch_size=8, seq_len=64, seed=0)
    inputs, targets = batches.get(step)            # (8, 64) each; targets = inputs shifted by one
    inputs[dp_slice(8, dp_rank, dp)]               # this data-parallel rank's share

The tokenizer is the identity on bytes (vocabulary 256): nothing to train or download, and 256
divides evenly among 1, 2, 4 or 8 vocabulary-parallel ranks. The text's source and licence are in
data/NOTICE.md. A batch depends only on (seed, step), so every rank of every layout can draw the
same global batch without talking, and a resumed run continues with the batches it would have
seen.
"""

from __future__ import annotations

from importlib import resources

import torch

TEXTS = ("macbeth.txt", "tempest.txt")
VOCAB_SIZE = 256


def load_text(names=TEXTS) -> bytes:
    """The shipped plays, concatenated, as bytes."""
    folder = resources.files("minipar.models") / "data"
    return b"\n\n".join((folder / name).read_bytes() for name in names)


def encode(text: str | bytes) -> torch.Tensor:
    """Bytes (str: its UTF-8 bytes) -> int64 token ids in [0, 256)."""
    data = text.encode() if isinstance(text, str) else bytes(text)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)


def decode(ids) -> str:
    """Token ids -> text (bytes that are not valid UTF-8 become U+FFFD)."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def load_tokens(split: str = "train", val_fraction: float = 0.1) -> torch.Tensor:
    """The corpus as tokens: the first (1 - val_fraction) for "train", the rest for "val"."""
    if split not in ("train", "val", "all"):
        raise ValueError(f"split must be 'train', 'val' or 'all', got {split!r}")
    tokens = encode(load_text())
    cut = int(len(tokens) * (1 - val_fraction))
    return {"train": tokens[:cut], "val": tokens[cut:], "all": tokens}[split]


class Batches:
    """Random windows of `seq_len + 1` tokens; batch `step` is a function of (seed, step) alone."""

    def __init__(self, tokens: torch.Tensor, batch_size: int, seq_len: int, seed: int = 0):
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if len(tokens) < seq_len + 2:
            raise ValueError(f"{len(tokens)} tokens are too few for seq_len={seq_len}")
        self.tokens, self.batch_size, self.seq_len, self.seed = tokens, batch_size, seq_len, seed

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (batch_size, seq_len) int64; targets: inputs shifted by one."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(len(self.tokens) - self.seq_len - 1, (self.batch_size,), generator=g)
        offsets = torch.arange(self.seq_len + 1)
        windows = self.tokens[starts[:, None] + offsets]
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def dp_slice(batch_size: int, dp_rank: int, dp: int) -> slice:
    """The rows of a global batch that data-parallel rank `dp_rank` of `dp` trains on."""
    if batch_size % dp:
        raise ValueError(f"batch_size={batch_size} is not divisible by dp={dp}")
    share = batch_size // dp
    return slice(dp_rank * share, (dp_rank + 1) * share)
