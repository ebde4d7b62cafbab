"""A tiny GPT, dense (one device): the model every parallel layout is checked against.

    config = GPTConfig(hidden=64, n_layers=4, n_heads=4)
    model = build_gpt(config, seed=0)
    logits = model(tokens)                        # (batch, seq) int64 -> (batch, seq, vocab)
    loss = lm_loss(logits, targets)
    nn.Sequential(*model.stages())                # embedding, block, ..., block, head

The shape of GPT-2: token + position embedding, `n_layers` pre-norm blocks
(x + attn(ln1(x)), then x + mlp(ln2(x))), a final LayerNorm and a linear head to the vocabulary,
tied to the token embedding or not. Attention and MLP are the tensor-parallel layers' dense
twins (minipar.parallel.tensor.DenseSelfAttention / DenseMLP), so their `from_dense` slices
exactly these weights.

How the parallel build (parallel_gpt.py) maps onto it: `embed.tok` becomes a
VocabParallelEmbedding (rows of the vocabulary per tp rank; `embed.pos` stays whole), each
block's `attn` and `mlp` their tensor-parallel twins (from_dense), `head.proj` a column-parallel
layer over the vocabulary whose logits go to vocab_parallel_cross_entropy, and the blocks are
cut into pipeline stages. A tied head on a pipeline lives on the first and the last stage: their
two gradients of the shared weight are summed between those stages before the optimizer step
(Megatron's embedding group), so the parallel model stays this tied model.

With `n_experts` = E > 0 every other block (1, 3, 5, ...) has a mixture of experts for its MLP:
minipar.parallel.expert.DenseMoE (a router and E MLPs of the same shape, top_k of them per
token, dropless), which the parallel build cuts with MoE.from_dense over the expert-parallel
group. Every other block, as Switch and GShard alternate dense and expert layers: the model
keeps dense layers between the expert ones and the step's all-to-alls are halved.

Every parameter is initialised from its own generator, seeded by (seed, the parameter's name):
a pipeline stage that builds only blocks 4-7, or a tensor-parallel rank that slices them, gets
the same numbers as the whole dense model, whatever else it builds and in whatever order.
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn
from torch.nn import functional as F

from minipar.models.config import GPTConfig
from minipar.parallel.expert.dense import DenseMoE
from minipar.parallel.tensor.dense import DenseMLP, DenseSelfAttention

__all__ = ["GPT", "GPTConfig", "Block", "Embedding", "Head", "build_gpt", "lm_loss"]


class Embedding(nn.Module):
    """Token embedding plus learned position embedding: (batch, seq) ids -> (batch, seq, hidden)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.hidden)
        self.pos = nn.Embedding(config.seq_len, config.hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seq = idx.shape[-1]
        if seq > self.pos.num_embeddings:
            raise ValueError(
                f"sequence of {seq} tokens is longer than seq_len={self.pos.num_embeddings}"
            )
        return self.tok(idx) + self.pos(torch.arange(seq, device=idx.device))


class Block(nn.Module):
    """One pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)); block `index`'s
    mlp is a DenseMoE (dropless, config.top_k of config.n_experts) when config.is_moe(index)."""

    def __init__(self, config: GPTConfig, index: int = 0):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.hidden)
        self.attn = DenseSelfAttention(config.hidden, config.n_heads)
        self.ln2 = nn.LayerNorm(config.hidden)
        if config.is_moe(index):
            self.mlp = DenseMoE(config.hidden, config.ffn, config.n_experts, config.top_k)
        else:
            self.mlp = DenseMLP(config.hidden, config.ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """Final LayerNorm and the projection to vocabulary logits. Tied: the projection's weight is
    the token embedding's own tensor (`tie(embedding)`), so it gets both modules' gradients."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_f = nn.LayerNorm(config.hidden)
        self.proj = nn.Linear(config.hidden, config.vocab_size, bias=False)

    def tie(self, embedding: Embedding) -> None:
        self.proj.weight = embedding.tok.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.ln_f(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.embed = Embedding(config)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.head = Head(config)
        if config.tied_head:
            self.head.tie(self.embed)

    def stages(self) -> list[nn.Module]:
        """The model as a list of layers a pipeline can split: embedding, blocks..., head.
        They are the model's own modules (no copies)."""
        return [self.embed, *self.blocks, self.head]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of next-token prediction over every position of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def param_seed(seed: int, name: str) -> int:
    """A parameter's own seed: a function of the run's seed and the parameter's name only."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63)


def init_tensor(tensor: torch.Tensor, name: str, seed: int, n_layers: int) -> None:
    """GPT-2's initialisation, from the parameter's own generator: weights N(0, 0.02), the two
    projections back into the residual stream (attn.proj, mlp.fc2, the experts' w2) scaled by
    1/sqrt(2 n_layers) so the residual's variance does not grow with depth; biases (the
    experts' b1, b2 too) 0; LayerNorm weights 1. The router's gate is a weight like any other."""
    with torch.no_grad():
        if name.endswith(("bias", "experts.b1", "experts.b2")):
            tensor.zero_()
        elif ".ln" in f".{name}":  # ln1, ln2, ln_f: LayerNorm weights
            tensor.fill_(1.0)
        else:
            std = 0.02
            if name.endswith(("attn.proj.weight", "mlp.fc2.weight", "experts.w2")):
                std /= math.sqrt(2 * n_layers)
            g = torch.Generator().manual_seed(param_seed(seed, name))
            values = torch.randn(tensor.shape, generator=g, dtype=torch.float32) * std
            tensor.copy_(values.to(tensor.dtype))


def init_weights(model: GPT, seed: int = 0) -> GPT:
    """Initialise every parameter of the model from (seed, its name); returns the model."""
    for name, param in model.named_parameters():  # a tied weight is listed once, as embed.tok
        init_tensor(param, name, seed, model.config.n_layers)
    return model


def build_gpt(config: GPTConfig | None = None, seed: int = 0) -> GPT:
    """A dense GPT with deterministic weights: the same (config, seed) gives the same bits."""
    return init_weights(GPT(config or GPTConfig()), seed)
