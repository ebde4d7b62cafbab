# Generated from solutions/ex10_moe_dispatch.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 10`.
# The grader admits these imports here (others it refuses, naming the line):
#   torch
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 10, the dispatch of a mixture-of-experts layer (lesson 10: expert parallelism).

The router gave each of T tokens k experts: `experts` (T, k) holds their ids in [0, E), and
`kept` (T, k) says which copies fit their expert's capacity. Copy c = t * k + j is token t's
j-th choice. Before the all-to-all, this rank puts its copies in the order they travel:

    copies (T=4, k=2):   t0->e2 t0->e0 | t1->e1 t1->e3 | t2->e0 t2->e1 | t3->e3 t3->e2
    sorted by expert:    e0: c1 c4 | e1: c2 c5 | e2: c0 c7 | e3: c3 c6
    order:               [1, 4, 2, 5, 0, 7, 3, 6]         counts (E=4): [2, 2, 2, 2]
    split sizes (p=2):   rank 0 owns e0, e1: 4 rows; rank 1 owns e2, e3: 4 rows

Write three functions (torch tensors of int64 in, as in minipar/parallel/expert/dispatch.py):

- `sort_by_expert`: `order`, the T*k copy numbers sorted by expert, stably (copies of one
  expert keep their copy order), the dropped copies (kept False) all after the kept ones, in
  copy order too; and `counts` (E,), the kept copies of each expert.
- `split_sizes`: the rows for each of p ranks; rank q owns experts q*E/p .. (q+1)*E/p - 1.
- `inverse_permutation`: `inverse` with inverse[order[i]] = i: the expert outputs come back in
  sorted order, and `outputs[inverse]` puts each at its copy's place.

The grader checks them on hand-made and random routings against minipar's own, then plugs
yours into minipar's MoE layer on real ranks: the outputs, gradients and the all-to-all's bytes
must be what minipar's own dispatch gives. Copy i is token i // k's choice i % k (its
experts[t, j]); a failure names the first expert whose token count differs, or the first
position of order that holds another copy, yours beside the reference's.

Grade it: minipar grade 10
"""

import torch


def sort_by_expert(experts: torch.Tensor, kept: torch.Tensor, n_experts: int):
    """(order (T*k,), counts (E,)): copies sorted stably by expert, dropped ones last."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")


def split_sizes(counts: torch.Tensor, n_ranks: int) -> list:
    """Rows for each rank (a list of p ints): the counts of its E/p experts, summed."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """inverse with inverse[order[i]] = i, for every i."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
