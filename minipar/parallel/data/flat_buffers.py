"""FSDP's flat vectors in the node's shared window: two slots, taken in turn.

A sharding unit's full parameter vector exists only while the unit computes, and its full
gradient only until it is reduce-scattered; keeping one window buffer per unit would hold the
whole model on every rank, which is what FSDP exists to avoid. So FSDP keeps two slots of the
largest unit's size (fp32) in one `collectives.empty` allocation, in the node's shared window,
and a unit's vectors take them in turn:

    i, full = slots.take(numel, dtype)      # forward, or backward's re-gather: the next slot
    slots.give(i)                           # forward done: the vector is dropped
    i, flat = slots.reuse(i, numel, fp32)   # backward done: the same slot takes the gradients
    slots.hold(i, work)                     # free again once their reduce-scatter has finished

When a unit's backward is done nothing reads its parameters any more, so its gradients go into
the slot its parameters were gathered into: two slots cover forward, backward and the
reduce-scatter of the unit before, at 2 x the largest unit (fp32) per rank. A slot still held by
a reduce-scatter is waited for, never skipped; one still holding a gathered vector (a unit
nested in another) is skipped; with none left, the vector is private. All of it follows the
program's order of gathers and reduce-scatters, the same on every rank (they are collectives),
never a timing, so every rank's twin of a vector sits in the same slot: the in-place all-gather
and reduce-scatter (collectives/fast/in_place.py) read the peers' slots where they lie, and the
round checks it (a twin elsewhere is a MismatchError, not a wrong sum).

Where the group cannot share memory (the torch transport, ranks on several nodes, the fast paths
off) there are no slots: each vector is a private tensor, made when needed and freed after.
"""

from __future__ import annotations

import torch

from minipar import collectives
from minipar.collectives.window_buffer import shared_node

ALIGN = 4096  # slots start on pages


class Slots:
    """`count` flat buffers of `nbytes` each, from one collectives.empty call (collective)."""

    def __init__(self, nbytes: int, count: int, comm, device):
        self.device, self.count, self.nbytes = device, count, nbytes
        self.slots, self.taken, self.work, self.turn = [], [], [], 0
        if device.type != "cpu" or shared_node(comm, f"FSDP's slots on group {comm.name}") is None:
            return  # private vectors, made when needed
        stride = -(-max(nbytes, 1) // ALIGN) * ALIGN
        raw = collectives.empty((count * stride,), torch.uint8, group=comm)
        self.slots = [raw[i * stride : i * stride + nbytes] for i in range(count)]
        self.taken = [False] * count  # holding a gathered vector
        self.work = [None] * count  # the reduce-scatter still reading a gradient vector

    def _typed(self, i: int, numel: int, dtype) -> torch.Tensor:
        return self.slots[i][: numel * dtype.itemsize].view(dtype)

    def take(self, numel: int, dtype) -> tuple:
        """(slot, a view of numel elements of it): the next slot in turn not holding a gathered
        vector, once its reduce-scatter (if any) has finished; (None, a private tensor) when
        there is none, or the vector does not fit."""
        fits = numel * dtype.itemsize <= self.nbytes
        for k in range(len(self.slots) if fits else 0):
            i = (self.turn + k) % self.count
            if not self.taken[i]:
                self._settle(i)
                self.taken[i], self.turn = True, (i + 1) % self.count
                return i, self._typed(i, numel, dtype)
        return None, torch.empty(numel, dtype=dtype, device=self.device)

    def give(self, i) -> None:
        if i is not None:
            self.taken[i] = False

    def reuse(self, i, numel: int, dtype) -> tuple:
        """Slot i's gathered vector is done with: (i, the same slot as numel of `dtype`); with
        no slot (i None) the next one in turn (take); (None, a private tensor) when it does not
        fit (slot i given back)."""
        if i is None:
            return self.take(numel, dtype)
        if numel * dtype.itemsize > self.nbytes:
            self.give(i)
            return None, torch.empty(numel, dtype=dtype, device=self.device)
        return i, self._typed(i, numel, dtype)

    def hold(self, i, work) -> None:
        """Slot i is free once `work` (a collective reading it) has finished."""
        if i is not None:
            self.taken[i], self.work[i] = False, work

    def _settle(self, i: int) -> None:
        if self.work[i] is not None:
            work, self.work[i] = self.work[i], None
            work.wait()

    def drain(self) -> None:
        """Wait for every collective still reading a slot."""
        for i in range(len(self.slots)):
            self._settle(i)
