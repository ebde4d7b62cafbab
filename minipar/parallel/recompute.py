"""Activation recomputation: keep less for backward, and compute it again when backward needs it.

    recompute.apply(model, "full", blocks=(Block,))   # every block keeps only its input
    recompute.apply(model, "selective")               # every attention core keeps only q, k, v
    recompute.apply(model, "none")                    # nothing changes

A training step's memory grows with the activations autograd keeps between forward and backward
(activation_memory.py measures them exactly). Recomputation trades compute for that memory
(Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models"):

- full: a transformer block keeps its input (s b h values) and nothing else; when backward
  reaches it, its forward runs again and rebuilds the rest. One more forward of every block (a
  third more compute) and, with tensor parallelism, its two all-reduces again: 6 per block a
  step instead of 4.
- selective: only the attention core (scores, softmax, times v: tensor/dense.AttentionCore)
  keeps its inputs q, k, v and nothing else. What it drops is the s x s softmax, the one term
  of the activations that grows with the sequence (Korthikanti's 5as/h beside 34); computing it
  again costs the core's two small matrix products, a few percent of the step.

How, with saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks). While a recomputed
module runs forward, each tensor an op saves for backward is replaced by a token (a slot number
of the call's Frame); the Frame keeps the module's inputs. Autograd builds its ordinary graph.
In backward, the first node that unpacks a token makes the Frame run the module's forward again
on the kept inputs (grad enabled, so every op saves the same tensors in the same order) and
hands out what it saved; the ordinary graph's nodes compute the ordinary gradients from those.
The same kernels on the same numbers: the loss and every gradient are bitwise the run's without
recomputation (tests/ranks/gpt_recompute.py checks it in every layout the tiny GPT trains in).

A recomputed module's own hooks run again with it: FSDP all-gathers the unit's weights (as its
backward does anyway), a tensor-parallel block all-reduces again in its forward. A second
backward through the same graph (retain_graph: zero-bubble's W after B) recomputes again. The
module must compute the same numbers twice: minipar's models draw no random numbers (dropout
would need its generator's state kept and restored, as torch.utils.checkpoint does).

What the mechanism did is counted, per recomputed module (a few integer additions a call):

    recompute.counts(block)    # Counts(calls=1, saved=24, replays=1, released=24)
    recompute.live(block)      # (0, 0, 0): Frames alive, recomputed tensors waiting, their bytes

After a forward and its backward, replays == calls (one replay per recorded forward; k
backwards through a retained graph: k replays) and released == saved x replays (every
recomputed tensor handed to backward, and dropped by its Frame); live is (0, 0, 0) once the
graph is gone, and between two backwards through a retained graph no recomputed tensor waits
in a slot (the second one replays again instead of reusing the first's).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from minipar.comm.trace import ledger
from minipar.parallel import activation_memory
from minipar.parallel.tensor.dense import AttentionCore

POLICIES = ("none", "selective", "full")


def check(policy) -> None:
    if policy not in POLICIES:
        raise ValueError(f"recompute must be one of {', '.join(POLICIES)}, got {policy!r}")


def apply(module: torch.nn.Module, policy: str, blocks: tuple = ()) -> list[str]:
    """Recompute the submodules of `module` the policy names: "full" every instance of the types
    in `blocks`, "selective" every AttentionCore, "none" nothing. Returns their names."""
    check(policy)
    kinds = {"none": (), "selective": (AttentionCore,), "full": tuple(blocks)}[policy]
    if policy == "full" and not kinds:
        raise ValueError("recompute='full' needs the block types to recompute (blocks=...)")
    names = []
    for name, sub in module.named_modules():
        if kinds and isinstance(sub, kinds):
            recomputed(sub, name)
            names.append(name)
    return names


@dataclass
class Counts:
    """What one recomputed module's mechanism did, since it was made recomputed."""

    calls: int = 0  # forwards run under grad through a Frame (not the replays)
    saved: int = 0  # tensors those forwards saved for backward, each kept as a token
    replays: int = 0  # forwards run again in backward
    released: int = 0  # recomputed tensors handed to backward (and dropped by their Frame)


def counts(module: torch.nn.Module) -> Counts:
    """The Counts of a module that `recomputed` changed (ValueError for any other)."""
    return _owner(module).counts


def live(module: torch.nn.Module) -> tuple[int, int, int]:
    """(Frames alive, recomputed tensors waiting in their slots, those tensors' bytes)."""
    frames = list(_owner(module).frames)
    waiting = [t for f in frames for t in f.slots.values()]
    return len(frames), len(waiting), sum(t.numel() * t.element_size() for t in waiting)


def _owner(module) -> _Recomputed:
    owner = module.__dict__.get("forward")
    if not isinstance(owner, _Recomputed):
        raise ValueError(f"{type(module).__name__} is not recomputed (recompute.recomputed)")
    return owner


def recomputed(module: torch.nn.Module, name: str = "") -> torch.nn.Module:
    """`module`, its forward made to keep only its inputs (the module itself, changed in place:
    its parameters and their names stay as they were)."""
    if not isinstance(module.__dict__.get("forward"), _Recomputed):
        module.forward = _Recomputed(module, module.forward, name or type(module).__name__)
    return module


class _Recomputed:
    """The forward of a recomputed module: under grad, through a new Frame's hooks."""

    def __init__(self, module, forward, name: str):
        self.module, self.forward, self.name = module, forward, name
        self.replaying = False  # True while a Frame runs the forward again
        self.counts, self.frames = Counts(), weakref.WeakSet()

    def __call__(self, *inputs):
        if self.replaying or not torch.is_grad_enabled():
            return self.forward(*inputs)
        frame = Frame(self, inputs)
        self.counts.calls += 1
        self.frames.add(frame)
        with activation_memory.hooks(frame.pack, frame.unpack):
            return self.forward(*inputs)


class Frame:
    """One recomputed call: its inputs kept, a slot number handed to autograd for each tensor its
    forward saved, and the slots filled by running the forward again on the first unpack.

    Every token holds the Frame, so the Frame (and the inputs) lives until autograd has dropped
    the last of them: after the module's backward, or with the graph."""

    def __init__(self, owner: _Recomputed, inputs):
        self.owner = owner
        self.inputs = [activation_memory.keep(x) if torch.is_tensor(x) else x for x in inputs]
        self.saved = 0  # tensors the forward saved: tokens 0 .. saved-1
        self.slots: dict[int, torch.Tensor] = {}  # recomputed, not yet handed to backward

    def pack(self, _tensor):
        self.saved += 1
        self.owner.counts.saved += 1
        return (self, self.saved - 1)

    def unpack(self, token):
        _, slot = token
        if slot not in self.slots:
            self.replay()
        self.owner.counts.released += 1
        return self.slots.pop(slot)

    def replay(self) -> None:
        """The module's forward again, its saved tensors caught in order (its output dropped)."""
        inputs = [activation_memory.unwrap(x) for x in self.inputs]
        inputs = [
            x.detach().requires_grad_(x.requires_grad) if torch.is_tensor(x) else x for x in inputs
        ]
        caught = []

        def catch(t):
            caught.append(t)
            return len(caught) - 1

        owner = self.owner
        owner.counts.replays += 1
        catching = torch.autograd.graph.saved_tensors_hooks(catch, caught.__getitem__)
        with ledger.span(f"recompute {owner.name}", "recompute"), torch.enable_grad(), catching:
            owner.replaying = True
            try:
                owner.module(*inputs)  # its hooks too: FSDP gathers the unit's weights
            finally:
                owner.replaying = False
        if len(caught) != self.saved:
            raise RuntimeError(
                f"recomputing {owner.name}: its forward saved {len(caught)} tensors the second "
                f"time and {self.saved} the first; a recomputed module must run the same ops"
            )
        self.slots = dict(enumerate(caught))
