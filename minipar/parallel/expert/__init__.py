"""Expert parallelism: a mixture-of-experts layer whose tokens travel by all-to-all.

    from minipar.parallel.expert import MoE, DenseMoE
    moe = MoE.from_dense(DenseMoE(hidden, ffn, n_experts=4, top_k=2), group=ep_group)
    y = moe(x); loss = task(y) + 0.01 * moe.aux_loss; moe.last_stats.summary(ep)

One idea per file: router.py (top-k gating, capacity, the load-balancing loss), dispatch.py
(this rank's copies sorted by expert, split sizes, the inverse permutation), exchange.py (the
count all-gather and the uneven all-to-all as an autograd function), experts.py (a batch of
expert FFNs), moe.py (the expert-parallel layer), dense.py (its single-process twin),
checks.py (bad input, on every rank before any token moves), stats.py (the load), groups.py
(which ranks share an expert when ep < dp, and their gradient reduction). Importing this
package imports torch.
"""

from minipar.parallel.expert.dense import DenseMoE
from minipar.parallel.expert.dispatch import (
    Plan,
    inverse_permutation,
    plan,
    sort_by_expert,
    split_sizes,
)
from minipar.parallel.expert.exchange import AllToAll, all_to_all, exchange_counts
from minipar.parallel.expert.experts import Experts
from minipar.parallel.expert.groups import (
    expert_data_parallel_ranks,
    expert_parallel_ranks,
    expert_parameters,
    ranks_sharing_expert,
    sync_expert_grads,
)
from minipar.parallel.expert.moe import MoE
from minipar.parallel.expert.router import Router, Routing, capacity
from minipar.parallel.expert.stats import LoadStats

__all__ = [
    "AllToAll",
    "DenseMoE",
    "Experts",
    "LoadStats",
    "MoE",
    "Plan",
    "Router",
    "Routing",
    "all_to_all",
    "capacity",
    "exchange_counts",
    "expert_data_parallel_ranks",
    "expert_parallel_ranks",
    "expert_parameters",
    "inverse_permutation",
    "plan",
    "ranks_sharing_expert",
    "sort_by_expert",
    "split_sizes",
    "sync_expert_grads",
]
