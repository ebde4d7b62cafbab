"""The tiny GPT built for a DeviceMesh: this rank's tensor-parallel slice of its pipeline stage.

    chunks = build_chunks(dense_model, mesh, virtual_stages=1)   # a list of StageChunk
    logits = chunks[0](tokens)             # pp = 1: the whole model, vocabulary-split logits
    loss = vocab_parallel_cross_entropy(logits, targets, mesh.tp_group)

Every piece is made from the dense model's own module by `from_dense` (or copied whole), so
every layout starts from the dense model's weights:

    embed.tok   -> VocabParallelEmbedding (V/tp rows per rank, the vocabulary padded first
                   where tp does not divide it: sharding.py; one all-reduce forward)
    embed.pos   -> copied whole (every tp rank adds the same position rows)
    blocks.i    -> ParallelSelfAttention + ParallelMLP (one all-reduce forward, one backward
                   each), LayerNorms copied whole
    head.proj   -> VocabParallelHead, column-parallel over the (padded) vocabulary: logits
                   stay split, padded ones -inf, and vocab_parallel_cross_entropy never
                   gathers them (3 numbers per token move)

Context parallelism (mesh.cp > 1): every rank holds seq/cp tokens of each sequence in the
load-balanced causal layout (minipar.parallel.context.layout); the embedding adds those tokens'
own positions (`positions`), each block's attention is a ContextParallelSelfAttention (ring or
Ulysses over cp_group), and everything else runs on the local tokens unchanged. Mixture of
experts: an MoE block's mlp is MoE.from_dense over mesh.ep_group (this rank's E/ep experts;
the experts are whole on every tp rank of its place: tensor parallelism splits the attention
and the dense MLPs, not the experts).

The pipeline cuts the blocks into pp * virtual_stages global stages of equal size (n_layers must
divide); the first global stage also holds the embedding and the last the head. A StageChunk
names its parameters exactly as the dense model does (blocks keep their global index), so
`named_parameters()` is the map from this rank's tensors to the dense state dict.

A tied head: with one pipeline stage the head's projection is the embedding's own tensor (both
are the same vocabulary rows of the same matrix), so autograd sums its two gradients. With
pp > 1 the first and the last stage each hold a copy; `TiedHead.sync` sums their gradients
(one exchange of V/tp x hidden numbers each way between the two ranks, over pp_group), so both
copies take the same AdamW step and stay equal: the model is still the dense tied model.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from minipar.comm.transport.base import wait_all
from minipar.models import precision
from minipar.models.gpt import GPT
from minipar.models.sharding import VOCAB_MULTIPLE
from minipar.parallel import replicas
from minipar.parallel.context import ContextParallelSelfAttention, layout
from minipar.parallel.expert import DenseMoE, MoE
from minipar.parallel.tensor import (
    ParallelMLP,
    ParallelSelfAttention,
    VocabParallelEmbedding,
    VocabParallelHead,
)

TIED_TAG = 7_777  # the tied head's gradient exchange on pp_group (the pipeline's tags are done)


class ParallelEmbedding(nn.Module):
    """Vocabulary-parallel token embedding plus the positions of this rank's tokens: 0..s-1, or
    with `positions` (context parallelism) those global positions, in the local order."""

    def __init__(self, embed, tp_group, positions: torch.Tensor | None = None):
        super().__init__()
        self.tok = VocabParallelEmbedding.from_dense(embed.tok, tp_group, VOCAB_MULTIPLE)
        self.pos = copy.deepcopy(embed.pos)
        replicas.mark_replicated(self.pos.weight, tp_group)  # every tp rank's whole table
        self.positions = positions  # a plain attribute: not a buffer that DDP would broadcast

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self.positions is None:
            where = torch.arange(idx.shape[-1], device=idx.device)
        elif idx.shape[-1] != len(self.positions):
            raise ValueError(
                f"this rank holds {len(self.positions)} tokens of each sequence (context "
                f"parallel), got {idx.shape[-1]}: pass shard_sequence(tokens, 1, cp_group, True)"
            )
        else:
            where = self.positions.to(idx.device)
        return self.tok(idx) + self.pos(where)


class ParallelBlock(nn.Module):
    """A block's tensor-parallel twin; with `cp_group` its attention runs over the context-
    parallel group (`variant`: "ring" or "ulysses"), with an MoE mlp its experts over
    `ep_group`."""

    def __init__(self, block, tp_group, cp_group=None, variant="ring", ep_group=None):
        super().__init__()
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        if cp_group is None:
            self.attn = ParallelSelfAttention.from_dense(block.attn, tp_group)
        else:
            self.attn = ContextParallelSelfAttention.from_dense(
                block.attn, tp_group, cp_group, variant
            )
        if isinstance(block.mlp, DenseMoE):
            self.mlp = MoE.from_dense(block.mlp, ep_group)
            replicas.mark_replicated(self.mlp.parameters(), tp_group)  # whole on every tp rank
        else:
            self.mlp = ParallelMLP.from_dense(block.mlp, tp_group)
        for ln in (self.ln1, self.ln2):
            replicas.mark_replicated(ln.parameters(), tp_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ParallelHead(nn.Module):
    """Final LayerNorm and the column-parallel projection: this rank's Vp/tp logits."""

    def __init__(self, head, tp_group):
        super().__init__()
        self.ln_f = copy.deepcopy(head.ln_f)
        replicas.mark_replicated(self.ln_f.parameters(), tp_group)
        self.proj = VocabParallelHead.from_dense(head.proj, tp_group, VOCAB_MULTIPLE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.ln_f(x))


class StageChunk(nn.Module):
    """Consecutive layers of the model on this rank: maybe the embedding, blocks (keyed by their
    global index), maybe the head."""

    def __init__(self, embed=None, blocks=None, head=None):
        super().__init__()
        self.embed, self.head = embed, head
        self.blocks = nn.ModuleDict(blocks or {})
        self.precision = "fp32"  # the run's compute dtype (models/precision.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with precision.autocast(self.precision, x.device.type):
            if self.embed is not None:
                x = self.embed(x)
            for block in self.blocks.values():
                x = block(x)
            return self.head(x) if self.head is not None else x


def check_layout(config, tp: int, pp: int, virtual_stages: int = 1) -> None:
    """ValueError naming the numbers when the model cannot be cut this way (every rank alike)."""
    if config.n_heads % tp:
        raise ValueError(f"n_heads={config.n_heads} is not divisible by tp={tp}")
    if config.n_layers % (pp * virtual_stages):
        raise ValueError(
            f"n_layers={config.n_layers} is not divisible by pp={pp} x "
            f"virtual_stages={virtual_stages} (stages of equal size)"
        )


def stage_blocks(n_layers: int, n_stages: int, stage: int) -> range:
    """The global block indices of global stage `stage` of `n_stages` equal stages."""
    per = n_layers // n_stages
    return range(stage * per, (stage + 1) * per)


def build_chunks(
    model: GPT, mesh, virtual_stages: int = 1, cp_variant: str = "ring"
) -> list[StageChunk]:
    """This rank's chunks (global stages c * pp + pp_rank for c < virtual_stages), sliced for
    its tp rank (and its experts for its ep rank) from the dense `model` (left as it was)."""
    config, tp_group = model.config, mesh.tp_group
    check_layout(config, mesh.tp, mesh.pp, virtual_stages)
    n_stages = mesh.pp * virtual_stages
    cp_group = mesh.cp_group if mesh.cp > 1 else None
    positions = None
    if mesh.cp > 1:  # this rank's tokens of the load-balanced causal layout
        positions = layout.positions(mesh.cp_rank, mesh.cp, config.seq_len, causal=True)
    chunks = []
    for c in range(virtual_stages):
        stage = c * mesh.pp + mesh.pp_rank
        blocks = {
            str(i): ParallelBlock(model.blocks[i], tp_group, cp_group, cp_variant, mesh.ep_group)
            for i in stage_blocks(config.n_layers, n_stages, stage)
        }
        embed = ParallelEmbedding(model.embed, tp_group, positions) if stage == 0 else None
        head = ParallelHead(model.head, tp_group) if stage == n_stages - 1 else None
        chunks.append(StageChunk(embed, blocks, head))
    if config.tied_head and n_stages == 1:
        chunks[0].head.proj.weight = chunks[0].embed.tok.weight
    return chunks


class TiedHead:
    """The gradient sum of a tied head whose two copies live on the first and the last pipeline
    rank (pp > 1); a no-op on every other rank and for an untied or unsplit model."""

    def __init__(self, chunks, mesh, tied: bool):
        self.mesh, self.param, self.peer = mesh, None, None
        if not tied or mesh.pp == 1:
            return
        for chunk in chunks:
            if mesh.is_first_stage and chunk.embed is not None:
                self.param, self.peer = chunk.embed.tok.weight, mesh.pp - 1
            if mesh.is_last_stage and chunk.head is not None:
                self.param, self.peer = chunk.head.proj.weight, 0
                replicas.mark_replicated(self.param, mesh.pp_group)  # stage 0's is counted

    def sync(self) -> None:
        """grad <- grad + the other copy's grad, on both ranks (one sendrecv of the grad)."""
        if self.param is None:
            return
        g = self.param.grad
        mine = g.detach().clone() if g is not None else torch.zeros_like(self.param)
        theirs = torch.empty_like(mine)
        comm = self.mesh.pp_group
        reqs = [comm.irecv(theirs, self.peer, TIED_TAG), comm.isend(mine, self.peer, TIED_TAG)]
        wait_all(reqs, comm.timeout, "tied head: exchanging the embedding's gradient")
        self.param.grad = mine + theirs


def dense_named_parameters(chunks, mesh, tied: bool):
    """(dense name, parameter) of this rank, each dense name once: the last stage's copy of a
    tied head is left out (it equals the first stage's embed.tok.weight)."""
    seen = set()
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if tied and mesh.pp > 1 and name == "head.proj.weight":
                continue
            if name not in seen:
                seen.add(name)
                yield name, param
