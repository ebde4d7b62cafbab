"""Lesson 10's exercise on real ranks (imported by exercises.py: one launch grades them all): the
student's dispatch plugged into minipar's MoE layer. Calls the student's function first."""

import os

import minipar
from minipar import exercises

IMPL = os.environ.get("MINIPAR_EXERCISES_IMPL", "solutions")
NAMES = ("sort_by_expert", "split_sizes", "inverse_permutation")


def moe_on_ranks():
    """MoE (ep = the world, top-2, capacity 1.0) with the student's three functions in place of
    minipar's dispatch: output, input gradient and all-to-all bytes as with minipar's own."""
    import torch

    from minipar.parallel.expert import DenseMoE, MoE, dispatch

    mod = exercises.load("ex10_moe_dispatch", IMPL)
    mod.split_sizes(torch.zeros(2, dtype=torch.int64), 1)  # an unstarted exercise stops here
    r, p = minipar.get_rank(), minipar.get_world_size()
    torch.manual_seed(11)
    moe = MoE.from_dense(DenseMoE(8, 16, 2 * p, top_k=2, capacity_factor=1.0))
    x = torch.randn(10, 8, generator=torch.Generator().manual_seed(r))
    runs = []
    for fns in ({}, {name: getattr(mod, name) for name in NAMES}):
        saved = {name: getattr(dispatch, name) for name in fns}
        try:
            for name, fn in fns.items():
                setattr(dispatch, name, fn)
            xi = x.clone().requires_grad_()
            with minipar.trace() as t:
                y = moe(xi)
                y.sum().backward()
            runs.append((y.detach(), xi.grad, t.bytes_sent("all_to_all")))
        finally:
            for name, fn in saved.items():
                setattr(dispatch, name, fn)
    (y0, g0, b0), (y1, g1, b1) = runs
    assert torch.allclose(y1, y0, rtol=1e-5, atol=1e-6), "MoE's output differs with your dispatch"
    assert torch.allclose(g1, g0, rtol=1e-5, atol=1e-6), "the input gradient differs"
    assert b1 == b0, f"the all-to-alls sent {b1} bytes with your dispatch, {b0} with minipar's"


def ex10_cases(size):
    return {"ex10_moe_dispatch/moe_on_ranks": moe_on_ranks}
