"""ZeRO stage 1: each rank keeps optimizer state for its shard of the parameters only.

    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss.backward()      # every rank has the full (averaged) gradients, e.g. through DDP
    opt.step()           # rank r steps its shard, then broadcasts the updated parameters

Roughly:
    partition: parameters -> ranks, whole parameters, balanced by element count (largest first,
               each to the least-loaded rank)
    step:      local optimizer steps the shard -> for each rank q: broadcast q's updated
               parameters (one flat buffer per dtype) from q

What moves per step: every parameter once, from its owner: with tree/pipelined broadcasts about
Psi bytes per rank (Psi = parameter bytes), p broadcasts. What it saves: an optimizer with K
bytes of state per parameter element (Adam in fp32: K = 8, two moments) holds K * Psi_r on rank
r, Psi_r about Psi / N_d, instead of K * Psi (the ZeRO paper's K*Psi/N_d).

The update of each parameter is the wrapped optimizer's own arithmetic on the same numbers, so
the parameters are bitwise those of the unsharded optimizer.

Hybrid (sharded inside a node, replicated across): the gradients reduced over every rank (DDP
over the whole group), this optimizer over the shard group only (`group=` a node's ranks). Each
shard group then holds the whole state once, and the broadcasts of the updated parameters stay
inside it: about Psi per rank on the node's links, none across.
"""

from __future__ import annotations

import torch

from minipar import collectives, runtime


def partition(sizes: list[int], world: int) -> list[int]:
    """Owner rank of each parameter: largest first (equal sizes in index order), each to the
    rank with the fewest elements so far (ties to the lowest rank). Deterministic, so every rank
    computes the same answer. The most-loaded rank then holds at most the least-loaded one's
    elements plus the smallest parameter of its own shard (its last: when it came, that rank
    was the least loaded)."""
    # BEGIN ANSWER ex05_zero1_step
    load, owner = [0] * world, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda q: (load[q], q))
        owner[i] = r
        load[r] += sizes[i]
    return owner
    # END ANSWER


def _check_optimizer_class(optimizer_class) -> None:
    if not (
        isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)
    ):
        raise TypeError(
            f"optimizer_class must be a torch.optim.Optimizer subclass (the class, e.g. "
            f"torch.optim.AdamW), got {optimizer_class!r}"
        )


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose state is sharded over `group` (ZeRO-1)."""

    def __init__(self, params, optimizer_class, group=None, **kwargs):
        _check_optimizer_class(optimizer_class)
        # the wrapped class's full defaults (and its own check of kwargs), on a stand-in
        defaults = optimizer_class([torch.zeros(1, requires_grad=True)], **kwargs).defaults
        super().__init__(params, dict(defaults))
        self.comm = runtime.resolve(group)
        self.group, self.optimizer_class = group, optimizer_class
        self._all = [p for g in self.param_groups for p in g["params"]]
        self.owner = partition([p.numel() for p in self._all], self.comm.size)
        rank = self.comm.rank
        self._owned = {id(p) for p, r in zip(self._all, self.owner) if r == rank}
        local_groups = [
            {
                **{k: v for k, v in g.items() if k != "params"},
                "params": [p for p in g["params"] if id(p) in self._owned],
            }
            for g in self.param_groups
        ]
        self.optim = None  # a rank with no parameters (more ranks than parameters) steps nothing
        if any(g["params"] for g in local_groups):
            self.optim = optimizer_class(local_groups, **kwargs)

    def add_param_group(self, param_group) -> None:
        if getattr(self, "optim", None) is not None:
            raise NotImplementedError(
                "ZeroRedundancyOptimizer: add_param_group after construction is not supported "
                "(the partition is fixed); build a new optimizer with every group"
            )
        super().add_param_group(param_group)

    def _push_hyperparameters(self) -> None:
        """A scheduler changes lr (etc.) on self.param_groups; the local optimizer follows."""
        if self.optim is None:
            return
        for mine, local in zip(self.param_groups, self.optim.param_groups):
            for k, v in mine.items():
                if k != "params":
                    local[k] = v

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._push_hyperparameters()
        if self.optim is not None:
            self.optim.step()
        self._share_updates()
        return loss

    def _share_updates(self) -> None:
        """Every rank's updated shard reaches every rank: one broadcast per owner and dtype."""
        for q in range(self.comm.size):
            mine = [p for p, r in zip(self._all, self.owner) if r == q]
            by_kind: dict = {}
            for p in mine:
                by_kind.setdefault((p.dtype, p.device), []).append(p)
            for group in by_kind.values():
                flat = torch.cat([p.detach().reshape(-1) for p in group])
                collectives.broadcast(flat, q, group=self.comm)
                offset = 0
                for p in group:
                    p.copy_(flat[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()

    def state_bytes(self) -> int:
        """Bytes of optimizer state held on this rank (tensors only)."""
        if self.optim is None:
            return 0
        return sum(
            v.numel() * v.element_size()
            for s in self.optim.state.values()
            for v in s.values()
            if torch.is_tensor(v)
        )

    def state_dict(self):
        """The whole optimizer's state, as the unsharded optimizer would give it (parameters
        numbered in param_groups order). Collective: every rank of the group must call it."""
        index = {id(p): i for i, p in enumerate(self._all)}
        local = {}
        if self.optim is not None:
            for p, s in self.optim.state.items():
                local[index[id(p)]] = {
                    k: v.cpu() if torch.is_tensor(v) else v for k, v in s.items()
                }
        state = {}
        for shard in self.comm.allgather_object(local, "gather the optimizer state"):
            state.update(shard)
        groups, k = [], 0
        for g in self.param_groups:
            groups.append(
                {
                    **{n: v for n, v in g.items() if n != "params"},
                    "params": list(range(k, k + len(g["params"]))),
                }
            )
            k += len(g["params"])
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict) -> None:
        """Load a state_dict of this optimizer (or of the unsharded one): each rank keeps the
        entries of its own shard."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)
        ):
            raise ValueError("load_state_dict: the param_groups do not match this optimizer's")
        for mine, saved in zip(self.param_groups, groups):
            mine.update({k: v for k, v in saved.items() if k != "params"})
        self._push_hyperparameters()
        if self.optim is None:
            return
        ids = [i for g in groups for i in g["params"]]
        local_ids = [ids[k] for k, p in enumerate(self._all) if id(p) in self._owned]
        local_groups, k = [], 0
        for g in self.optim.param_groups:
            local_groups.append(
                {
                    **{n: v for n, v in g.items() if n != "params"},
                    "params": local_ids[k : k + len(g["params"])],
                }
            )
            k += len(g["params"])
        state = {i: s for i, s in state_dict["state"].items() if i in set(local_ids)}
        self.optim.load_state_dict({"state": state, "param_groups": local_groups})
