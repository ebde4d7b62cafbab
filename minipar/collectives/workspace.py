"""Scratch space that lives from call to call, so large collectives do not pay for fresh pages.

A new numpy array of 32 MiB costs about as much again as copying it, the first time it is
written: the kernel hands out its pages one fault at a time. A ring all-reduce of 64 MiB on two
ranks needs a 32 MiB chunk of scratch on every call, so allocating it each time made the call
~20% slower (measured with `minipar bench`). Instead each thread (the caller's, the progress
thread's) keeps one buffer per slot and grows it when a call needs more; an algorithm that needs
two scratch buffers at the same time uses slots 0 and 1.

Only numpy buffers are kept, and only up to LIMIT bytes each: torch's allocators cache memory
by themselves, and a huge one-off call should not pin its scratch for the life of the process.
"""

from __future__ import annotations

import threading

import numpy as np

from minipar.comm.transport import buffers

LIMIT = 256 << 20
_scratch_cache = threading.local()  # a cache: per-thread scratch buffers, grown on demand


def empty(like, n: int, slot: int = 0):
    """n elements of like's dtype and device, valid until this thread asks for `slot` again."""
    nbytes = n * buffers.itemsize(like)
    if not isinstance(like, np.ndarray) or nbytes > LIMIT:
        return buffers.empty(like, n)
    slots = _scratch_cache.__dict__.setdefault("slots", {})
    raw = slots.get(slot)
    if raw is None or raw.nbytes < nbytes:
        raw = slots[slot] = np.empty(nbytes, np.uint8)
    return raw[:nbytes].view(like.dtype)
