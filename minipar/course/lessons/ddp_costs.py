"""What a DDP step pays here beyond the ring's bytes, measured at the start of lesson 05, and the
step each way of synchronising gradients costs by the model that prices them.

    costs = measure(page, model, x, y)     # collective: every rank
    exposed(costs, sizes, p, link)         # {"naive": s, "per parameter": s, "one bucket": s}

The quantities, each measured the fastest of a few runs (a run other processes interrupted is
slower, never faster):

    call_s     the naive sync of the lesson's own gradients right after a backward wrote them
               (a blocking all-reduce and a division a tensor), less the model's time for their
               bytes on a collective step's cost, per tensor: what a call on a gradient adds
               (a call on a small tensor that nothing has just written costs a fraction of it)
    launch_s   one blocking all-reduce of a small torch tensor, less the model's time for its
               bytes: a call's own cost, what each of DDP's launches pays (DDP reduces its
               buckets, which its hooks filled, not the gradients backward wrote)
    handoff_s  the same all-reduce with async_op=True and wait(), less the blocking one: the
               progress thread taking the job and handing it back
    hook_s     one post-accumulate-grad hook that copies its gradient into a bucket, per
               parameter (DDP's hook, less the launch)
    own_s      DDP's own work in one step, per parameter, with nothing to send: a per-parameter
               DDP on a group of this rank alone (its hooks, the copies into and out of its
               buckets, the launches, the progress thread's hand-offs and waits, the closing
               `used` call), less the plain backward and less each launch's call (a blocking
               call on a group of one: the Python that launch_s prices already)
    bucket_s   the same for a DDP of one 25 MB bucket, the whole step's: its hooks, the copy
               of every gradient into the bucket, its hand-off and wait, the `used` call

The model of each variant's exposed communication (the step less the compute-only step):

    naive          sum over tensors of (ring(size) + call_s)
    per parameter  sum over tensors of (ring(size) + launch_s), plus DDP's own work (own_s per
                   tensor), plus the bytes of DDP's
                   closing `used` all-reduce; nothing overlaps where the ranks have no spare
                   core (the progress thread waits for the backward to end), so it is never
                   faster than naive
    one bucket     ring(Psi) + launch_s + bucket_s (DDP's own work, the copies included) + the
                   bytes of the closing `used` all-reduce
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import minipar
from minipar import cost


@dataclass(frozen=True)
class Costs:
    call_s: float
    handoff_s: float
    hook_s: float
    own_s: float
    bucket_s: float = 0.0
    launch_s: float = 0.0


def fastest(page, fn, reps: int = 20, prepare=None) -> float:
    """The fastest of reps (barrier; fn()), the slowest rank's time (collective); `prepare()`,
    when given, runs before each barrier, untimed."""
    fn()  # warm up
    best = float("inf")
    for _ in range(reps):
        if prepare is not None:
            prepare()
        page.comm.barrier()
        t0 = time.perf_counter()
        fn()
        best = min(best, max(page.gather(time.perf_counter() - t0)))
    return best


def measure(page, model, x, y, link) -> Costs:
    """call_s, handoff_s and hook_s on this machine (collective)."""
    # here, not at the top of the file: torch loads only when the lesson measures
    import torch

    small = torch.zeros(64)
    blocking = fastest(page, lambda: minipar.all_reduce(small, algorithm="ring"))
    handed = fastest(
        page, lambda: minipar.all_reduce(small, algorithm="ring", async_op=True).wait()
    )
    params = list(model.parameters())
    slots = [torch.empty_like(q) for q in params]

    def backward() -> None:
        for q in params:
            q.grad = None
        ((model(x) - y) ** 2).mean().backward()

    plain = fastest(page, backward, 10)

    def naive() -> None:  # lesson 05's naive sync, on the gradients backward has just written
        for q in params:
            minipar.all_reduce(q.grad, algorithm="ring")
            q.grad.div_(page.size)

    synced = fastest(page, naive, 10, prepare=backward)
    rings = sum(cost.predict("all_reduce", "ring", 4 * q.numel(), page.size, link) for q in params)

    def into(slot):
        def hook(param) -> None:  # DDP's _grad_ready, less the launch: the copy into a bucket
            slot.copy_(param.grad)

        return hook

    handles = [q.register_post_accumulate_grad_hook(into(s)) for q, s in zip(params, slots)]
    try:
        hooked = fastest(page, backward, 10)
    finally:
        for handle in handles:
            handle.remove()
    # every rank makes every group; each uses its own: DDP's machinery with no byte to move
    mine = [minipar.new_group([r], name=f"ddp-alone-{r}") for r in range(page.size)][page.rank]
    alone, bucket = ddp_alone(page, mine, model, x, y, 0), ddp_alone(page, mine, model, x, y, 25)
    # a call's own Python on a group of one: the alone DDPs paid it a launch, and launch_s
    # prices it already, so it comes off their own work
    single = fastest(page, lambda: minipar.all_reduce(small, algorithm="ring", group=mine))
    n = len(params)
    launch = max(blocking - cost.predict("all_reduce", "ring", small.nbytes, page.size, link), 0.0)
    return Costs(max(synced - rings, 0.0) / n, max(handed - blocking, 0.0),
                 max(hooked - plain, 0.0) / n, max(alone - plain - n * single, 0.0) / n,
                 max(bucket - plain - single, 0.0), launch)  # fmt: skip


def ddp_alone(page, alone, model, x, y, cap_mb: float = 0) -> float:
    """One step of a DDP (buckets of cap_mb; 0: one a parameter) over `alone`, a group of this
    rank alone (collective: the fastest of 10, the slowest rank's): DDP's whole machinery, no
    byte to move."""
    # here, not at the top of the file: DDP loads torch, only when the lesson measures
    from minipar.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(copy.deepcopy(model), group=alone, bucket_cap_mb=cap_mb,
                                  algorithm="ring")  # fmt: skip

    def step() -> None:
        for q in ddp.parameters():
            q.grad = None
        ((ddp(x) - y) ** 2).mean().backward()

    return fastest(page, step, 10)


def exposed(costs: Costs, sizes: list[int], p: int, link) -> dict:
    """Each variant's exposed communication by the model (the module docstring's sums)."""
    ring = [cost.predict("all_reduce", "ring", n, p, link) for n in sizes]
    used_bytes = cost.predict("all_reduce", "ring", len(sizes), p, link)  # DDP's `used` map
    naive = sum(ring) + len(sizes) * costs.call_s
    per_parameter = sum(ring) + len(sizes) * (costs.launch_s + costs.own_s) + used_bytes
    psi = sum(sizes)
    bucket = cost.predict("all_reduce", "ring", psi, p, link) + costs.launch_s + costs.bucket_s
    bucket += used_bytes  # its call: in bucket_s
    return {"naive": naive, "per parameter": per_parameter, "one bucket": bucket}
