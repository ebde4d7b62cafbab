"""One rank's share of the tiny GPT on a DeviceMesh, and what a training step does with it.

    part = MeshGPT(spec, mesh)                 # from the seeded dense weights (or model=...)
    local = part.forward_backward(inputs, targets)   # this dp rank's rows of the global batch
    part.sync_grads()                          # data parallel, then the tied head
    opt.step()
    state = part.dense_state()                 # collective: the dense state dict, every rank
    grads = part.dense_grads()                 # collective: the step's gradients, dense names

A step, from the outside in:
- data parallel: the dp ranks take equal slices of the global batch; each chunk is wrapped in
  DistributedDataParallel over dp_group (or FullyShardedDataParallel with --fsdp, see
  `data_parallel`); after a pipeline's flush DDP averages the accumulated gradients once;
- pipeline parallel (pp > 1): `Pipeline` runs the stage over pp_group with the run's schedule
  and micro-batches (activations forward, their gradients backward, point to point);
  pp = 1: the micro-batches run one after the other, their gradients accumulating;
- tensor parallel: inside every layer (see parallel_gpt.py); the loss is
  vocab_parallel_cross_entropy over tp_group, on the logits' vocabulary slices;
- context parallel (cp > 1): each rank takes its seq/cp tokens of every sequence of its rows
  (`shard_batch`: the load-balanced causal layout, inputs and targets alike), attention runs
  over cp_group; a rank's loss is the mean over its own tokens, so the replicated parameters'
  gradients are averaged over the dp x cp ranks (dp_cp_group), as data parallelism averages
  over dp ranks (every rank holds as many tokens);
- expert parallel: an MoE block's experts are spread over ep_group (and DDP leaves them alone);
  after the data-parallel average, `sync_grads` sums each expert's gradient over the ranks
  holding it (expert_dp_group) and divides by dp x cp, DDP's divisor: each expert's gradient
  then equals the dense model's over the whole global batch.

The reported loss is the whole global batch's mean on every rank: the last stage's mean is
averaged over dp_cp_group and broadcast from the last stage over pp_group (8 bytes each).
"""

from __future__ import annotations

import contextlib

import torch

from minipar import collectives
from minipar.comm.trace import ledger
from minipar.models import fsdp_state, memory, precision, sharding
from minipar.models.gpt import build_gpt
from minipar.models.parallel_gpt import (
    ParallelBlock,
    ParallelEmbedding,
    ParallelHead,
    TiedHead,
    build_chunks,
    dense_named_parameters,
)
from minipar.parallel import activation_memory, recompute, replicas
from minipar.parallel.context import shard_sequence
from minipar.parallel.data import DistributedDataParallel, FullyShardedDataParallel
from minipar.parallel.expert import MoE, expert_parameters, sync_expert_grads
from minipar.parallel.pipeline import Pipeline
from minipar.parallel.tensor import vocab_parallel_cross_entropy


def virtual_stages_of(spec, mesh) -> int:
    """Chunks per rank: 2 for the interleaved schedule on a real pipeline, else 1."""
    return 2 if spec.schedule == "interleaved" and mesh.pp > 1 else 1


class MeshGPT:
    def __init__(self, spec, mesh, model=None, device="cpu"):
        self.spec, self.mesh, self.config = spec, mesh, spec.model
        dense = model if model is not None else build_gpt(spec.model, spec.seed)
        v = virtual_stages_of(spec, mesh)
        chunks = build_chunks(dense, mesh, v, spec.cp_variant)
        self.chunks = [chunk.to(device) for chunk in chunks]
        for chunk in self.chunks:
            chunk.precision = spec.dtype  # autocast in its forward: fp32 weights, bf16 matmuls
        self.recomputed = recompute_blocks(self.chunks, spec.recompute)
        self.tied = TiedHead(self.chunks, mesh, spec.model.tied_head)
        self.fsdp = spec.fsdp and mesh.dp * mesh.cp > 1
        reduce_dtype = precision.dtype_of(spec.reduce_dtype)
        hybrid = hybrid_groups(mesh, spec.dp_shard) if self.fsdp else None
        self.wrapped = [
            data_parallel(c, mesh, self.fsdp, reduce_dtype, hybrid) for c in self.chunks
        ]
        self.param_keys = {activation_memory.storage_key(q) for q in self.parameters()}
        self.memory = None  # the last step's saved activations (models/memory.py)
        self.loss_scale = 1.0  # fp16: the loss scaler's, for this step's backward
        self.pipe = None
        if mesh.pp > 1:
            self.pipe = Pipeline(
                self.wrapped if v > 1 else self.wrapped[0],
                group=mesh.pp_group,
                n_microbatches=spec.microbatches,
                schedule=spec.schedule,
                loss_fn=self.loss_fn if mesh.is_last_stage else None,
                virtual_stages=v,
            )

    def parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer steps, each once: this rank's parameters (FSDP: its shards and the
        replicated ones; a tied head on one stage is one tensor)."""
        seen, out = set(), []
        for module in self.wrapped:
            for q in module.parameters():
                if id(q) not in seen:
                    seen.add(id(q))
                    out.append(q)
        return out

    def named_parameters(self):
        """(dense name, this rank's tensor) for every dense parameter this rank holds (not with
        FSDP, whose parameters are flat shards: see _pieces)."""
        return dense_named_parameters(self.chunks, self.mesh, self.config.tied_head)

    # -- a step -----------------------------------------------------------------------------
    def shard_batch(self, tokens: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of its dp rows (batch, seq): seq/cp of them in the load-balanced
        causal layout (all of them when cp = 1). No communication."""
        if self.mesh.cp == 1:
            return tokens
        return shard_sequence(tokens, 1, group=self.mesh.cp_group, causal=True)

    def loss_fn(self, logits, targets):
        """The vocabulary-parallel cross-entropy on fp32 logits, times the loss scale."""
        loss = vocab_parallel_cross_entropy(logits.float(), targets, self.mesh.tp_group)
        return loss * self.loss_scale if self.loss_scale != 1 else loss

    def forward_backward(self, inputs, targets, scale: float = 1.0) -> float | None:
        """Gradients of this dp rank's rows (of their loss times `scale`) accumulate in .grad;
        the rows' mean loss on the last pipeline stage, None on the others. `self.memory`: what
        the step kept for backward."""
        self.loss_scale = scale
        with memory.measure(self) as self.memory:
            loss = self._forward_backward(inputs, targets)
        return None if loss is None else loss / scale

    def _forward_backward(self, inputs, targets) -> float | None:
        if self.pipe is not None:
            first, last = self.mesh.is_first_stage, self.mesh.is_last_stage
            with self._no_sync():  # DDP: one all-reduce after the pipeline's flush
                loss = self.pipe.step(inputs if first else None, targets if last else None)
            return None if loss is None else loss.item()
        m, total = self.spec.microbatches, 0.0
        for i, (x, y) in enumerate(zip(inputs.chunk(m), targets.chunk(m))):
            with self._no_sync() if i < m - 1 else contextlib.nullcontext():
                with ledger.span(f"Forward {i}", "train"):  # spans: for a trace
                    loss = self.loss_fn(self.wrapped[0](x), y)  # DDP: the last backward syncs
                with ledger.span(f"Backward {i}", "train"):
                    (loss / m).backward()
            total += loss.item() / m
        return total

    def _no_sync(self):
        """DDP's no_sync on every chunk (FSDP and no data parallelism: nothing to hold back)."""
        stack = contextlib.ExitStack()
        for module in self.wrapped:
            if hasattr(module, "no_sync"):
                stack.enter_context(module.no_sync())
        return stack

    def sync_grads(self) -> None:
        """Finish the data-parallel average (DDP after a pipeline: now, one all-reduce per
        bucket), sum the experts' gradients over the ranks sharing them (one all-reduce per
        chunk with MoE blocks, divided by dp x cp as DDP divides), then sum the tied head's two
        copies' gradients (linear: the order is free)."""
        if self.pipe is not None:
            for module in self.wrapped:
                if hasattr(module, "all_reduce_gradients"):
                    module.all_reduce_gradients()
        divide_by = self.mesh.dp * self.mesh.cp
        for chunk in self.chunks:
            sync_expert_grads(chunk, self.mesh.expert_dp_group, divide_by)
        self.tied.sync()

    def global_loss(self, local: float | None) -> float:
        """The global batch's mean loss, the same number on every rank."""
        t = torch.tensor([local or 0.0], dtype=torch.float64)
        ranks = self.mesh.dp * self.mesh.cp
        if ranks > 1:
            collectives.all_reduce(t, group=self.mesh.dp_cp_group)
        if self.mesh.pp > 1:
            collectives.broadcast(t, group=self.mesh.pp_group, group_src=self.mesh.pp - 1)
        return t.item() / ranks

    def moe_stats(self) -> dict:
        """{block name: LoadStats} of this rank's MoE blocks at their last forward (each the
        whole ep group's load: every rank of the group holds the same numbers)."""
        return {
            f"block {name.split('.')[1]}": module.last_stats
            for chunk in self.chunks
            for name, module in chunk.named_modules()
            if isinstance(module, MoE) and module.last_stats is not None
        }

    # -- dense views (collective: every rank of the mesh calls them) -----------------------
    def dense_state(self) -> dict[str, torch.Tensor]:
        """The dense model's state dict (CPU tensors, GPT.state_dict's names) on every rank."""
        state = sharding.gather_dense(self._pieces(), self.mesh, self.config)
        state = {name: t.cpu() for name, t in state.items()}
        if self.config.tied_head:
            state["head.proj.weight"] = state["embed.tok.weight"]
        return state

    def dense_grads(self) -> dict[str, torch.Tensor]:
        """The dense model's gradients by name (CPU, float32) on every rank, gathered as
        dense_state gathers the weights: after sync_grads, the global batch's gradient, which
        must equal the dense model's on the whole batch (a parameter without one counts as
        zeros). A tied head is listed once, as embed.tok.weight, with both uses summed."""

        def grad_of(q):
            return q.grad.detach() if q.grad is not None else torch.zeros_like(q)

        state = sharding.gather_dense(self._pieces(grad_of), self.mesh, self.config)
        return {name: t.float().cpu() for name, t in state.items()}

    def _pieces(self, value_of=None) -> dict[str, torch.Tensor]:
        """Dense name -> this rank's tp slice (its experts' slice, for an MoE block) of
        value_of(parameter) (default: the weight), for the names of its stage (FSDP: the shards
        all-gathered over the data-parallel group first)."""
        if not self.fsdp:
            value_of = value_of or (lambda q: q.detach())
            return {name: value_of(q) for name, q in self.named_parameters()}
        pieces = {}
        for module in self.wrapped:
            if value_of is None:
                pieces.update(module.gather_full_params())
            else:
                pieces.update(fsdp_state.by_name(module, value_of))
        return pieces

    def optimizer_state(self, opt) -> dict:
        """AdamW's state by dense parameter name, gathered like the weights (every rank)."""
        if not opt.state:  # no step taken yet
            return {}
        out = {}
        for key in ("exp_avg", "exp_avg_sq"):
            if self.fsdp:
                pieces = {}
                for module in self.wrapped:
                    pieces.update(fsdp_state.by_name(module, lambda q, k=key: opt.state[q][k]))
            else:
                pieces = {name: opt.state[q][key] for name, q in self.named_parameters()}
            for name, full in sharding.gather_dense(pieces, self.mesh, self.config).items():
                out.setdefault(name, {})[key] = full.cpu()
        step = next(iter(opt.state.values()))["step"]
        for record in out.values():
            record["step"] = step.detach().clone().cpu()
        return out

    def load_optimizer_state(self, opt, states) -> None:
        """The inverse of optimizer_state: each tensor sliced for this rank's tp rank (and its
        FSDP shard)."""
        if not states:
            return
        mesh = self.mesh
        if self.fsdp:
            for module in self.wrapped:
                fsdp_state.load_shards(module, opt, states, mesh.tp_rank, mesh.tp, self._alias)
            return
        for chunk in self.chunks:
            for name, q in chunk.named_parameters():
                dense = states[self._alias(name)]
                opt.state[q] = {
                    k: v.clone() if k == "step" else
                    sharding.shard(name, v, mesh.tp_rank, mesh.tp, mesh.ep_rank, mesh.ep).to(
                        q.device)
                    for k, v in dense.items()
                }  # fmt: skip

    def _alias(self, name: str) -> str:
        """The dense name whose state a parameter takes: a tied head's copy takes the
        embedding's."""
        tied_copy = self.config.tied_head and name == "head.proj.weight"
        return "embed.tok.weight" if tied_copy else name


def recompute_blocks(chunks, policy: str) -> list[str]:
    """Recomputation (parallel/recompute.py) on every chunk's blocks ("full") or attention cores
    ("selective"), and each block's saved bytes counted under its name (models/memory.py).
    Returns the names of what is recomputed."""
    activation_memory.label_layers(
        {f"blocks.{i}": block for chunk in chunks for i, block in chunk.blocks.items()}
    )
    return [n for chunk in chunks for n in recompute.apply(chunk, policy, (ParallelBlock,))]


def hybrid_groups(mesh, shard: int):
    """Hybrid sharding's (shard group, replicate group) of this rank (MeshShape.hybrid_groups:
    runs of `shard` consecutive dp ranks, a node's when it holds them), or None (shard 0 or
    dp: sharded over every dp rank). Collective: every rank creates every group, in the same
    order (MPI_Comm_split)."""
    if not shard or shard == mesh.dp:
        return None
    mine = []
    for kind, every in mesh.shape.hybrid_groups(shard).items():
        for ranks in every:
            world = [mesh.group.global_ranks[r] for r in ranks]
            made = mesh.group.split(list(ranks), name=f"{kind}{world}")
            if mesh.rank in ranks:
                mine.append(made)
    return tuple(mine)


def data_parallel(chunk, mesh, fsdp: bool, reduce_dtype=None, hybrid=None):
    """The chunk wrapped for data parallelism over dp_group: DistributedDataParallel (bucketed
    gradient all-reduce, 2(p-1)/p of the chunk's gradient bytes per rank), or with `fsdp`
    FullyShardedDataParallel with one sharding unit per block, embedding and head (all-gather
    of a unit's weights before it computes, forward and backward, reduce-scatter of its
    gradient: 3(p-1)/p of the bytes). Over dp_cp_group: with context parallelism each cp rank's
    gradient covers its own tokens, reduced as the dp ranks' are. dp x cp = 1: the chunk.
    The experts, which sync_grads sums over expert_dp_group, are marked as copied over it (for
    the gradient norm: parallel/replicas.py), as DDP and FSDP mark what they average."""
    replicas.mark_replicated(expert_parameters(chunk), mesh.expert_dp_group)
    if mesh.dp * mesh.cp == 1:
        return chunk
    reduce_dtype = None if reduce_dtype == torch.float32 else reduce_dtype
    if fsdp:  # weights gathered in fp32 and cast by the chunk's autocast, as the dense twin's
        units = (ParallelBlock, ParallelEmbedding, ParallelHead)
        shard, replicate = hybrid or (mesh.dp_cp_group, None)  # hybrid: hybrid_groups
        return FullyShardedDataParallel(
            chunk,
            group=shard,
            shard_modules=units,
            reduce_dtype=reduce_dtype,
            replicate_group=replicate,
        )
    return DistributedDataParallel(chunk, group=mesh.dp_cp_group, reduce_dtype=reduce_dtype)
