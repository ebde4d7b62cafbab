"""Fully sharded data parallelism (ZeRO stage 3): parameters, gradients and optimizer state
are all sharded; a unit's full parameters exist only while the unit computes.

    model = FullyShardedDataParallel(net, compute_dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)     # the fp32 shards
    loss_fn(model(x_local), y_local).backward(); opt.step()

Roughly, per sharding unit (a module chosen by `shard_modules`):
    construction: its parameters -> one flat fp32 vector, padded to a multiple of p;
                  rank r keeps block r (an nn.Parameter: what the optimizer steps)
    forward:      my block (cast to compute_dtype) into a free slot -> all-gather the
                  others into it -> views as the module's weights -> run -> give the slot back
    backward:     a saved weight is needed -> all-gather again; when the unit's gradients are
                  complete -> one flat fp32 vector in a gradient slot -> reduce-scatter it
                  (averaged) -> rank r's block gradient

Where the vectors live: a few slots of the largest unit's size (flat_buffers.py), in the node's
shared window when the group's ranks share one over MPI (fast paths on), so the all-gather and
the reduce-scatter read the peers' slots where they lie (collectives/fast/in_place.py); private
memory elsewhere, with the same bits (the reduce-scatter takes the ring either way).

What moves per step for Psi parameter bytes: all-gather (p-1)/p Psi twice and reduce-scatter
(p-1)/p Psi: 3 (p-1)/p Psi per rank, 1.5x DDP's 2 (p-1)/p Psi (the ZeRO paper's count).
FSDP2's MixedPrecisionPolicy in two words: compute_dtype is its param_dtype (the all-gathers
move bf16: half the bytes), reduce_dtype the reduce-scatter's (default fp32; bf16 halves it,
each block back in fp32 on the fp32 shard). The shards and AdamW's state stay fp32.
Parameters outside every unit, shared by two units, or frozen stay replicated (cast to
compute_dtype on the way in); the gradients of the trainable ones are all-reduced.

Hybrid sharding (torch's HSDP, FSDP2 on a 2-D mesh, torchtitan's dp_shard x dp_replicate,
ZeRO++'s hierarchical partitioning): `replicate_group=` names the ranks holding the same shard
(one from each shard group, e.g. the same local rank on every node). The all-gathers and the
reduce-scatters stay inside `group` (s ranks: a node's fast links); after them ONE all-reduce
of this rank's gradient blocks (all units' at once) averages over the r replicas, so the
gradients are averaged over all s x r ranks. Per step: 3 (s-1)/s Psi inside, and 2 (r-1)/r
Psi/s across (a ring's; the block is a s-th of the parameters).

The full vector is kept alive neither by the module (its attributes are cleared after forward)
nor by autograd: a saved-tensor hook replaces every saved view of it by a small token, and the
backward pass gathers the unit again when it unpacks one. Every rank must run the same units in
the same order (the all-gathers are collectives), as with torch FSDP.
"""

from __future__ import annotations

import torch
from torch import nn

from minipar import collectives, runtime
from minipar.collectives.reduce_op import ReduceOp
from minipar.comm.trace import ledger
from minipar.parallel import activation_memory, replicas
from minipar.parallel.data.ddp import (
    broadcast_tensors,
    check_same_structure,
    reduction_algorithm,
    structure,
)
from minipar.parallel.data.flat_buffers import Slots

SLOTS = 2  # gathered or gradient vectors in the window at once: see flat_buffers.py


def _check_compute_dtype(dtype, name: str = "compute_dtype") -> None:
    if dtype is None:
        return
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(
            f"{name} must be None or a floating torch dtype (torch.float16, "
            f"torch.bfloat16, torch.float32), got {dtype!r}"
        )


def _occurrences(module: nn.Module) -> dict:
    """id(param) -> (param, [(owning module's name, module, attribute name), ...])."""
    seen: dict = {}
    for mname, mod in module.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            if p is not None:
                seen.setdefault(id(p), (p, []))[1].append((mname, mod, pname))
    return seen


def _innermost(mname: str, units: list[str]):
    """The deepest unit whose subtree holds module `mname` (None outside every unit)."""
    best = None
    for u in units:
        if u == "" or mname == u or mname.startswith(u + "."):
            if best is None or len(u) > len(best):
                best = u
    return best


def _check_replicate(comm, replicate_group):
    """The replicate group resolved (None without one, or with one rank), after checking that
    it crosses the shard groups: one rank of each, every one of the same size."""
    if replicate_group is None:
        return None
    replicate = runtime.resolve(replicate_group)
    shards = replicate.allgather_object(
        (comm.size, comm.rank), "compare the shard groups across the replicate group"
    )
    if any(size != comm.size for size, _ in shards):
        raise ValueError(
            f"replicate_group: its ranks' shard groups differ in size {[s for s, _ in shards]}; "
            "hybrid sharding needs shard groups of one size"
        )
    if any(rank != comm.rank for _, rank in shards):
        raise ValueError(
            f"replicate_group: its ranks hold shards {[r for _, r in shards]}; every rank of it "
            "must hold the same shard (the same rank of its own shard group)"
        )
    return replicate if replicate.size > 1 else None


class _Gather(torch.autograd.Function):
    """shard -> the unit's parameters, as views of its gathered full vector (all-gather); their
    gradients -> one flat vector -> its block (reduce-scatter). One output per parameter, so
    each gradient is copied once into the flat vector (no full-size zeros per parameter)."""

    @staticmethod
    def forward(ctx, shard, unit):
        ctx.unit = unit
        ctx.set_materialize_grads(False)  # a parameter without a gradient: None, not zeros
        return unit.views(unit.gather())

    @staticmethod
    def backward(ctx, *grads):
        ctx.unit.end_span()  # the unit's backward is done: its gradients are complete
        ctx.unit.reduce_scatter(grads, ctx.unit.hand_over())
        return None, None


def _shard_marks(p, mine: tuple, copies: tuple = ()) -> tuple:
    """p's marks (replicas.py) with the shard's group added to what it is cut over (and the
    replicate group, hybrid sharding's, to what it is copied over)."""
    sharded, copied = replicas.marks(p)
    return (*sharded, *mine), (*copied, *copies)


class Unit:
    """One sharding unit: its parameters as a flat vector, block `rank` of it kept here (the
    original parameters are not kept: only their place, shape and name)."""

    def __init__(self, owner, name: str, params: list[tuple]):
        self.owner, self.name = owner, name
        comm = owner.comm
        self.numel = sum(p.numel() for p, _ in params)
        self.block = -(-self.numel // comm.size)
        device = params[0][0].device
        flat = torch.zeros(self.block * comm.size, dtype=torch.float32, device=device)
        offset, self.layout = 0, []
        for p, where in params:
            flat[offset : offset + p.numel()] = p.detach().reshape(-1)
            self.layout.append((offset, p.shape, where, owner.names[id(p)]))
            offset += p.numel()
        start = comm.rank * self.block
        self.shard = nn.Parameter(flat[start : start + self.block].clone())
        # for the gradient norm: each tensor's marks (a tp slice beside a LayerNorm), and the
        # shard a piece of its own on every rank of the group
        mine = (owner.group,) if comm.size > 1 else ()
        copies = owner.replicate_marks
        marks = [(off, shape.numel(), _shard_marks(p, mine, copies)) for (p, _), (off, shape, *_)
                 in zip(params, self.layout)]  # fmt: skip
        self.shard.replica_pieces = replicas.flat_pieces(marks, start, start + self.block)
        self.full, self.slots = None, []  # the gathered vector, and the slots it took
        self.pending = []  # (work, reduced block) of in-flight reduce-scatters
        self.span = None  # a trace's open span of this unit's forward or backward

    def begin_span(self, phase: str) -> None:
        self.end_span()
        self.span = ledger.open_span(f"{phase} {self.name}", "fsdp")  # None: no trace open

    def end_span(self) -> None:
        if self.span is not None:
            self.span.close()
            self.span = None

    def gather(self, dtype=None) -> torch.Tensor:
        """All-gather the blocks, in compute_dtype (or `dtype`), into a free slot of the
        owner's (flat_buffers.py): my block is cast straight into its place in the vector, and
        the peers' blocks are read out of their slots where they lie (or arrive as messages)."""
        dtype = dtype or self.owner.compute_dtype or torch.float32
        comm = self.owner.comm
        slot, full = self.owner.slots.take(self.block * comm.size, dtype)
        self.slots.append(slot)
        mine = full[comm.rank * self.block : (comm.rank + 1) * self.block]
        mine.copy_(self.shard.detach())
        collectives.all_gather_into_tensor(full, mine, group=comm)
        self.full = full
        return full

    def views(self, full: torch.Tensor) -> tuple:
        """The unit's parameters as views of `full`, in layout order."""
        return tuple(full[o : o + shape.numel()].view(shape) for o, shape, _, _ in self.layout)

    def bind(self, views) -> None:
        """The module's weights become the views (autograd flows back through _Gather)."""
        for (_, _, where, _), view in zip(self.layout, views):
            for mod, attr in where:
                object.__setattr__(mod, attr, view)

    def forget(self) -> None:
        """Drop the gathered vector and give its slots back."""
        for slot in self.slots:
            self.owner.slots.give(slot)
        self.full, self.slots = None, []

    def release(self) -> None:
        self.forget()
        self._unbind()

    def hand_over(self):
        """Backward is done with the parameters: drop them, and return the slot they were
        gathered into (kept: the gradients go there), or None."""
        last = self.slots.pop() if self.slots else None
        self.forget()
        self._unbind()
        return last

    def _unbind(self) -> None:
        for _, _, where, _ in self.layout:
            for mod, attr in where:
                object.__setattr__(mod, attr, None)

    def reduce_scatter(self, grads, slot=None) -> None:
        """Average the unit's gradients over the group in fp32 (or the owner's reduce_dtype:
        bf16 halves the bytes); this rank keeps its block, in fp32. The gradients go into one
        flat vector (zeros where a parameter has none, and in the
        padding), in `slot` (where the parameters were gathered) or the next free one,
        reduce-scattered with the ring above 64 KiB (the bits of a window slot and a private
        vector agree), or across nodes auto's two-level one (ddp.reduction_algorithm)."""
        self.owner._queue_finish()
        comm, slots = self.owner.comm, self.owner.slots
        dtype = self.owner.reduce_dtype or torch.float32
        slot, flat = slots.reuse(slot, self.block * comm.size, dtype)
        for (offset, shape, _, _), grad in zip(self.layout, grads):
            part = flat[offset : offset + shape.numel()]
            if grad is None:
                part.zero_()
            else:
                part.copy_(grad.reshape(-1))
        flat[self.numel :].zero_()
        out = torch.empty(self.block, dtype=dtype, device=flat.device)
        algorithm = reduction_algorithm("auto", flat.numel() * dtype.itemsize, comm)
        work = collectives.reduce_scatter_tensor(
            out, flat, ReduceOp.AVG, group=comm, algorithm=algorithm, async_op=True
        )
        slots.hold(slot, work)
        self.pending.append((work, out))

    def collect(self) -> list:
        """Wait for the in-flight reduce-scatters: their blocks (in the reduce dtype)."""
        outs = []
        for work, out in self.pending:
            work.wait()
            outs.append(out)
        self.pending = []
        return outs

    def accumulate(self, out: torch.Tensor) -> None:
        out = out.float()  # a reduce_dtype block back to the fp32 shard's dtype
        if self.shard.grad is None:
            self.shard.grad = out
        else:
            self.shard.grad.add_(out)


class FullyShardedDataParallel(nn.Module):
    """ZeRO-3 over `group`; see the module docstring."""

    def __init__(
        self,
        module: nn.Module,
        group=None,
        compute_dtype=None,
        shard_modules=None,
        reduce_dtype=None,
        replicate_group=None,
    ):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        _check_compute_dtype(compute_dtype)
        _check_compute_dtype(reduce_dtype, "reduce_dtype")
        self.reduce_dtype = reduce_dtype
        for name, p in module.named_parameters():
            if p.dtype != torch.float32:
                raise TypeError(
                    f"parameter {name!r} is {p.dtype}; FSDP keeps fp32 master weights (use "
                    "compute_dtype for low-precision compute)"
                )
        if shard_modules is not None and not (
            isinstance(shard_modules, tuple) and all(isinstance(t, type) for t in shard_modules)
        ):
            raise TypeError(
                f"shard_modules must be None or a tuple of nn.Module types, got {shard_modules!r}"
            )
        self.comm = runtime.resolve(group)
        self.group, self.compute_dtype = group, compute_dtype
        self.replicate = _check_replicate(self.comm, replicate_group)
        self.replicate_group = replicate_group if self.replicate is not None else None
        self.replicate_marks = (replicate_group,) if self.replicate is not None else ()
        tensors = list(module.parameters()) + list(module.buffers())
        for comm in self._groups():  # inside the shard group, then across: one model everywhere
            check_same_structure(comm, structure(module))
            broadcast_tensors(tensors, comm)
        self.names = {id(p): n for n, p in module.named_parameters()}  # the unwrapped names
        self.module = module
        self._build_units(module, shard_modules)
        # forwards with grad whose backward has not finished: a pipeline runs several
        # micro-batches' forwards before their backwards, each backward finishing its own
        self._armed, self._callback_queued = 0, False

    def _build_units(self, module: nn.Module, shard_modules) -> None:
        def is_unit(mod):
            if shard_modules is None:
                return any(p is not None for p in mod._parameters.values())
            return isinstance(mod, shard_modules)

        unit_names = [n for n, m in module.named_modules() if is_unit(m)]
        members: dict = {u: [] for u in unit_names}
        self.replicated = []  # [(param, [(module, attribute), ...])]
        for p, places in _occurrences(module).values():
            for _, mod, attr in places:
                del mod._parameters[attr]
            homes = {_innermost(mname, unit_names) for mname, _, _ in places}
            where = [(mod, attr) for _, mod, attr in places]
            if p.requires_grad and len(homes) == 1 and None not in homes:
                members[homes.pop()].append((p, where))
            else:
                self.replicated.append((p, where))
        self.units = []
        modules = dict(module.named_modules())
        for u in unit_names:
            if members[u]:
                unit = Unit(self, u, members[u])
                self.units.append(unit)
                self.register_parameter(f"shard_{len(self.units) - 1}", unit.shard)
                modules[u].register_forward_pre_hook(self._pre_hook(unit))
                modules[u].register_forward_hook(self._post_hook(unit))
        self._make_slots(module)
        for i, (p, _) in enumerate(self.replicated):
            self.register_parameter(f"replicated_{i}", p)
            replicas.mark_replicated(p, self.comm)  # whole on every rank: counted once
            if self.replicate is not None:
                replicas.mark_replicated(p, self.replicate_group)
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda _p: self._queue_finish())

    def _make_slots(self, module: nn.Module) -> None:
        """The slots the units' full vectors and gradients take in turn (flat_buffers.py): in the
        node's shared window when the group's ranks share one (collective), each the largest
        unit's size in fp32 (gradients are fp32; parameters in compute_dtype or fp32)."""
        largest = max((u.block * self.comm.size for u in self.units), default=0)
        device = next((u.shard.device for u in self.units), torch.device("cpu"))
        width = max(4, (self.compute_dtype or torch.float32).itemsize)
        self.slots = Slots(largest * width, SLOTS, self.comm, device)

    def _pre_hook(self, unit: Unit):
        def hook(_module, _args):
            unit.begin_span("forward")
            unit.bind(_Gather.apply(unit.shard, unit))

        return hook

    def _post_hook(self, unit: Unit):
        def hook(_module, _args, _output):
            unit.release()
            unit.end_span()

        return hook

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():
            self._armed += 1
        cast = self.compute_dtype
        for p, where in self.replicated:
            value = p if cast is None or not p.is_floating_point() else p.to(cast)
            for mod, attr in where:
                object.__setattr__(mod, attr, value)
        if cast is not None:
            args = [a.to(cast) if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
        # saved-tensor hooks that the activation counter sees through (what stays in memory)
        with activation_memory.hooks(self._pack, self._unpack):
            return self.module(*args, **kwargs)

    def _pack(self, t: torch.Tensor):
        """A saved view of a unit's full vector becomes a token (the vector can be freed): the
        unit and where in its vector the view starts (the next gather may use another slot)."""
        ptr = t.data_ptr()
        for unit in self.units:
            full = unit.full
            if full is not None and t.dtype == full.dtype:
                start = full.data_ptr()
                if start <= ptr < start + full.numel() * full.element_size():
                    return (unit, t.storage_offset() - full.storage_offset(), t.shape, t.stride())
        return t

    def _unpack(self, packed):
        if torch.is_tensor(packed):
            return packed
        unit, offset, shape, stride = packed
        if unit.full is None:  # the unit's backward begins: gather its weights again
            unit.begin_span("backward")
            unit.gather()
        full = unit.full
        return full.as_strided(shape, stride, full.storage_offset() + offset)

    def _queue_finish(self) -> None:
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._callback_queued = True

    def _end_of_backward(self) -> None:
        self._callback_queued = False
        self.finish_gradient_synchronization()

    def finish_gradient_synchronization(self) -> None:
        """Wait for the reduce-scatters, then all-reduce (average) the replicated gradients.
        Idempotent: a no-op when no forward/backward is pending."""
        if not self._armed:
            return
        self._armed -= 1
        blocks = [(unit, out) for unit in self.units for out in unit.collect()]
        if self.replicate is not None and blocks:
            self._all_reduce_blocks([out for _, out in blocks])
        for unit, out in blocks:
            unit.accumulate(out)
        for unit in self.units:
            unit.forget()
        self.slots.drain()
        trainable = [p for p, _ in self.replicated if p.requires_grad]
        if trainable:
            self._all_reduce_replicated(trainable)

    def _groups(self) -> list:
        """The groups a replicated tensor is reduced over: the shard group, then (hybrid
        sharding) the replicate group."""
        return [self.comm] if self.replicate is None else [self.comm, self.replicate]

    def _all_reduce_blocks(self, outs: list) -> None:
        """Hybrid sharding: average this rank's reduce-scattered blocks over the replicate group,
        all in one flat all-reduce (2 (r-1)/r of their bytes with the ring), in place."""
        flat = torch.cat([o.reshape(-1) for o in outs])
        algorithm = reduction_algorithm("auto", flat.numel() * flat.element_size(), self.replicate)
        collectives.all_reduce(flat, ReduceOp.AVG, self.replicate, algorithm=algorithm)
        offset = 0
        for o in outs:
            o.copy_(flat[offset : offset + o.numel()].view_as(o))
            offset += o.numel()

    def _all_reduce_replicated(self, params) -> None:
        """Average the replicated gradients (zeros where a rank has none); a parameter no rank
        has a gradient for keeps grad None, as with DDP (one byte per parameter, MAX)."""
        used = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8)
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
        )
        for comm in self._groups():
            collectives.all_reduce(flat, ReduceOp.AVG, comm)
            collectives.all_reduce(used, ReduceOp.MAX, comm)
        offset = 0
        for p, flag in zip(params, used):
            if flag:
                p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    @torch.no_grad()
    def gather_full_params(self) -> dict:
        """{name: full fp32 tensor}, named as the unwrapped module's named_parameters().
        Collective: every rank of the group must call it."""
        out = {}
        for unit in self.units:
            full = unit.gather(torch.float32)
            for offset, shape, _, name in unit.layout:
                out[name] = full[offset : offset + shape.numel()].view(shape).clone()
            unit.forget()
        for p, _ in self.replicated:
            out[self.names[id(p)]] = p.detach().clone()
        order = list(self.names.values())
        return {n: out[n] for n in order}
