"""Activation memory, measured: the bytes autograd keeps between a forward and its backward.

    with ActivationMemory(model.parameters()) as mem:   # parameters are not activations
        loss = lm_loss(model(x), y)
    mem.live, mem.peak            # bytes kept for backward now, and the most at any moment
    loss.backward()               # each saved tensor is let go once its node's backward ran
    mem.live                      # 0 again; mem.peak is the step's peak
    mem.by_layer                  # {"blocks.0": bytes, ...}, with label_layers(...) beforehand

How it sees them: every op that needs a tensor in backward hands it to autograd, which passes it
to the pack hook of torch.autograd.graph.saved_tensors_hooks. The hook here counts the tensor's
storage (the memory really kept: a view keeps its whole storage, and two views of one storage
count once) and gives autograd a small wrapper instead; when autograd drops the wrapper (after
that node's backward, or with the graph), the storage's count goes down and at zero its bytes
leave `live`. So `live` is exact: the distinct storages autograd holds for backward, less the
parameters' (the weight a matrix product keeps is the parameter itself, not an activation).

Only the innermost pair of saved-tensor hooks runs, so code that installs its own installs them
through `hooks(pack, unpack)`: FSDP (a gathered weight becomes a token, gathered again in
backward) and recomputation (recompute.py: a token per saved tensor, recomputed in backward) go
on counting what they keep in memory, and nothing of what they drop. `keep(t)` counts a tensor
held some other way (recomputation's kept inputs) for as long as the returned wrapper lives.

With `track=True` each change of `live` is written to the open traces (minipar.trace(): the
counter track of the timeline). The open counters and the names of the layers running forward
are this process's state (minipar.state: memory_counters, memory_layers).
"""

from __future__ import annotations

import torch

from minipar.comm.trace import ledger
from minipar.state import process

TRACK = "saved activations"  # the name of the trace's counter track


def storage_key(t: torch.Tensor) -> tuple:
    """What identifies the memory a tensor lives in: its device and its storage's address."""
    return t.device, t.untyped_storage().data_ptr()


class ActivationMemory:
    """A counter of saved activation bytes while it is open (a context manager); see above."""

    def __init__(self, params=(), exclude=None, track: bool = False):
        self.exclude = set(exclude) if exclude is not None else set()
        self.exclude |= {storage_key(q) for q in params}
        self.live = self.peak = 0
        self.by_layer: dict[str, int] = {}  # bytes first kept while each layer ran forward
        self.track = track
        self._refs: dict = {}  # storage key -> [saved tensors holding it, its bytes]
        self._hooks = None

    def __enter__(self) -> ActivationMemory:
        process.memory_counters.append(self)
        self._hooks = hooks()
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        process.memory_counters.remove(self)

    def reset_peak(self) -> None:
        self.peak = self.live

    def _keep(self, t: torch.Tensor):
        """Count one more saved tensor on t's storage; its key, or None if not an activation."""
        key = storage_key(t)
        if key in self.exclude:
            return None
        ref = self._refs.get(key)
        if ref is not None:
            ref[0] += 1
            return key
        nbytes = t.untyped_storage().nbytes()
        self._refs[key] = [1, nbytes]
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        layer = process.memory_layers[-1] if process.memory_layers else "other"
        self.by_layer[layer] = self.by_layer.get(layer, 0) + nbytes
        if self.track:
            ledger.counter(TRACK, self.live)
        return key

    def _release(self, key) -> None:
        ref = self._refs[key]
        ref[0] -= 1
        if ref[0] == 0:
            del self._refs[key]
            self.live -= ref[1]
            if self.track:
                ledger.counter(TRACK, self.live)


class _Kept:
    """What autograd holds in place of a counted tensor: the tensor, and for each counter that
    counted it the storage's key; dropping it gives the bytes back."""

    __slots__ = ("tensor", "held")

    def __init__(self, tensor, held):
        self.tensor, self.held = tensor, held

    def __del__(self):
        for counter, key in self.held:
            counter._release(key)


def saved_bytes(fn) -> int:
    """The most bytes autograd kept for backward while fn() ran (distinct storages, counted
    once; parameters included: none are passed here)."""
    with ActivationMemory() as mem:
        fn()
    return mem.peak


def keep(t):
    """t counted by every open counter for as long as the returned object lives (t itself when
    no counter is open or none counts it); `unwrap` gives the tensor back."""
    if not process.memory_counters:
        return t
    held = []
    for counter in process.memory_counters:
        key = counter._keep(t)
        if key is not None:
            held.append((counter, key))
    return _Kept(t, held) if held else t


def unwrap(kept):
    return kept.tensor if type(kept) is _Kept else kept


def hooks(pack=None, unpack=None):
    """torch's saved_tensors_hooks(pack, unpack) (identity for None) with every tensor that `pack`
    leaves in memory counted by the open counters (a token it returns instead is not)."""

    def pack_hook(t):
        kept = t if pack is None else pack(t)
        return keep(kept) if isinstance(kept, torch.Tensor) else kept

    def unpack_hook(kept):
        kept = unwrap(kept)
        return kept if unpack is None else unpack(kept)

    return torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook)


def label_layers(named_modules) -> list:
    """While each of these modules (name -> module) runs forward, what is saved is counted under
    its name (ActivationMemory.by_layer). Returns the hook handles (`.remove()` undoes them).
    The name goes on before any other hook of the module runs (recomputation's keeps the
    module's input) and comes off after the last, even if the forward raises."""
    handles = []
    for name, module in dict(named_modules).items():

        def enter(_module, _args, name=name):
            process.memory_layers.append(name)

        def leave(_module, _args, _out):
            process.memory_layers.pop()

        handles.append(module.register_forward_pre_hook(enter, prepend=True))
        handles.append(module.register_forward_hook(leave, always_call=True))
    return handles
