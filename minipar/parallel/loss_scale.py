"""Dynamic loss scaling for fp16 training, the same decision on every rank of a mesh.

    scaler = LossScaler(mesh=mesh)          # 2^16 to start, x2 after 2000 good steps
    (loss * scaler.scale).backward()         # small gradients no longer flush to zero in fp16
    if scaler.unscale_(params):              # grads /= scale; False: an inf or NaN somewhere
        clip_grad_norm_(params, 1.0, mesh=mesh); opt.step()
    scaler.update()                           # overflow: scale / 2 (the step was skipped)

fp16 keeps 5 exponent bits: gradients under 2^-24 become 0. Multiplying the loss by S moves
every gradient up by S (backward is linear); the optimizer must see them divided again, before
anything reads their size: the clip's norm too (a norm taken before unscaling is S times too
large, and the clip then scales every gradient by 1/S too much). A step whose gradients hold an
inf or NaN (S too large) is skipped and S halved; after `interval` good steps S doubles.

Skipped steps must be the same on every rank, or the replicas part ways: each rank looks at its
own pieces, then one all-reduce (MAX, one float) over the mesh's ranks tells every rank
whether any rank saw one (mesh=None: one process, nothing to ask). bf16 keeps fp32's 8
exponent bits and needs no scaler (torch's GradScaler does this job for one process).
"""

from __future__ import annotations

import torch

from minipar import collectives, runtime
from minipar.collectives.reduce_op import ReduceOp


class LossScaler:
    def __init__(self, init_scale=2.0**16, growth=2.0, backoff=0.5, interval=2000, mesh=None):
        if not init_scale > 0 or not growth >= 1 or not 0 < backoff < 1 or interval < 1:
            raise ValueError(
                f"loss scaler: init_scale={init_scale!r} > 0, growth={growth!r} >= 1, "
                f"0 < backoff={backoff!r} < 1, interval={interval!r} >= 1 are needed"
            )
        self.scale, self.growth, self.backoff, self.interval = init_scale, growth, backoff, interval
        self.group = None if mesh is None else mesh.group  # None: this process alone
        self.good_steps, self.found_inf = 0, False

    def unscale_(self, params) -> bool:
        """Divide every gradient by the scale; True when every rank's are finite (collective:
        one all-reduce of one float over the mesh)."""
        bad = 0.0
        for q in params:
            if q.grad is not None:
                q.grad.detach().div_(self.scale)
                bad = max(bad, float(not torch.isfinite(q.grad).all()))
        flag = torch.tensor([bad], dtype=torch.float32)
        if self.group is not None and runtime.get_world_size(self.group) > 1:
            collectives.all_reduce(flag, ReduceOp.MAX, group=self.group)
        self.found_inf = bool(flag.item())
        return not self.found_inf

    def update(self) -> None:
        """After the step (taken or skipped): halve on overflow, grow after `interval` good."""
        if self.found_inf:
            self.scale *= self.backoff
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.interval:
            self.scale *= self.growth
            self.good_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
