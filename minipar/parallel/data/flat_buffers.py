"""FSDP's flat vectors in the node's shared window: a few slots, taken in turn.

A sharding unit's full parameter vector exists only while the unit computes, and its full
gradient only until it is reduce-scattered; keeping one window buffer per unit would hold the
whole model on every rank, which is what FSDP exists to avoid. So FSDP keeps a few slots of the
largest unit's size in one `collectives.empty` allocation (the node's shared window when the
group's ranks share memory, else private memory):

    params = Slots(nbytes, 2, comm)      # the gathered vectors: forward's, backward's again
    i, full = params.take(numel, dtype)  # a free slot, or (None, a private tensor) if none is
    params.give(i)                       # the unit released its vector
    grads = Slots(nbytes, 2, comm)       # the gradients being reduce-scattered
    i, flat = grads.take_after(numel, torch.float32)  # the next slot, once its last
    grads.hold(i, work)                                #   reduce-scatter has finished

Slots are taken and given back in the program's order, the same on every rank (the units'
gathers and reduce-scatters are collectives in the same order), so every rank's twin of a
vector sits in the same slot at the same time: the in-place all-gather and reduce-scatter
(collectives/fast/in_place.py) read the peers' slots where they lie. The round checks it (a
vector elsewhere on one rank is a MismatchError, not a wrong sum).
"""

from __future__ import annotations

import torch

from minipar import collectives

ALIGN = 4096  # slots start on pages


class Slots:
    """`count` flat buffers of `nbytes` each, from one collectives.empty call (collective)."""

    def __init__(self, nbytes: int, count: int, comm, device):
        self.device, self.count = device, count
        stride = -(-max(nbytes, 1) // ALIGN) * ALIGN
        if device.type == "cpu":
            raw = collectives.empty((count * stride,), torch.uint8, group=comm)
        else:
            raw = torch.empty(count * stride, dtype=torch.uint8, device=device)
        self.slots = [raw[i * stride : i * stride + nbytes] for i in range(count)]
        self.nbytes = nbytes
        self.taken = [False] * count
        self.work = [None] * count  # the collective still reading a gradient slot
        self.turn = 0

    def _typed(self, i: int, numel: int, dtype) -> torch.Tensor:
        return self.slots[i][: numel * dtype.itemsize].view(dtype)

    def take(self, numel: int, dtype) -> tuple:
        """(slot, a view of numel elements of it) for the first free slot from the last taken
        on; (None, a private tensor) when all are taken or it does not fit."""
        for k in range(self.count if numel * dtype.itemsize <= self.nbytes else 0):
            i = (self.turn + k) % self.count
            if not self.taken[i]:
                self.taken[i], self.turn = True, (i + 1) % self.count
                return i, self._typed(i, numel, dtype)
        return None, torch.empty(numel, dtype=dtype, device=self.device)

    def give(self, i) -> None:
        if i is not None:
            self.taken[i] = False

    def take_after(self, numel: int, dtype) -> tuple:
        """(slot, view) of the next slot in turn, once the collective holding it has finished
        (hold): a gradient slot is free when its reduce-scatter is done."""
        i, self.turn = self.turn, (self.turn + 1) % self.count
        if self.work[i] is not None:
            self.work[i].wait()
            self.work[i] = None
        return i, self._typed(i, numel, dtype)

    def hold(self, i: int, work) -> None:
        self.work[i] = work

    def drain(self) -> None:
        """Wait for every collective still reading a slot."""
        for i, work in enumerate(self.work):
            if work is not None:
                work.wait()
                self.work[i] = None
