"""Lesson 05's exercises on real ranks (imported by exercises.py: one launch grades them all).
Each case calls the student's function before it asserts anything."""

import os

import minipar
from minipar import exercises

IMPL = os.environ.get("MINIPAR_EXERCISES_IMPL", "solutions")


def student(module: str, function: str):
    return getattr(exercises.load(module, IMPL), function)


def _setup(kind="tied"):
    import torch
    from data_parallel import batch, build, local, loss_of

    comm = minipar.init()
    x, y = batch(kind)
    ref = build(kind, 0)
    loss_of(kind, ref(x), y).backward()
    model = build(kind, 0)
    loss_of(kind, model(local(x, comm)), local(y, comm)).backward()
    return torch, comm, model, ref


def _same_grads(torch, comm, model, ref):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if p.requires_grad and q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    mine = [p.grad.numpy().tobytes() for p in model.parameters() if p.grad is not None]
    seen = comm.allgather_object(mine)
    assert all(s == seen[0] for s in seen), "gradients differ across ranks"


def naive_matches_full_batch():
    torch, comm, model, ref = _setup()
    with minipar.trace() as t:
        student("ex05_naive_ddp", "all_reduce_gradients")(model)
    _same_grads(torch, comm, model, ref)
    trainable = [p for p in model.parameters() if p.requires_grad]
    calls = [c for c in t.calls if c.collective == "all_reduce"]
    assert len(calls) == len(trainable), (
        f"{len(calls)} all-reduces for {len(trainable)} trainable parameters (a tied weight is "
        "one parameter: reduce it once)"
    )


def buckets_shape():
    import torch
    from torch import nn

    from minipar.parallel.data.ddp import make_buckets as reference

    minipar.init()
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 64), nn.Linear(64, 4))
    params = list(model.parameters())
    for cap in (0, 100, 300, 1 << 20):
        got = student("ex05_bucketed_ddp", "make_buckets")(params, cap)
        want = [b.params for b in reference(params[::-1], cap)]
        assert [[id(p) for p in b] for b in got] == [[id(p) for p in b] for b in want], (
            f"cap {cap}: buckets {[[tuple(p.shape) for p in b] for b in got]}, want "
            f"{[[tuple(p.shape) for p in b] for b in want]}"
        )
    assert torch.is_tensor(params[0])


def bucketed_matches_full_batch():
    torch, comm, model, ref = _setup()
    with minipar.trace() as t:
        n = student("ex05_bucketed_ddp", "all_reduce_bucketed")(model.parameters(), 400)
    _same_grads(torch, comm, model, ref)
    calls = [c for c in t.calls if c.collective == "all_reduce"]
    assert len(calls) == n > 1, f"{len(calls)} all-reduces for {n} buckets"


def zero1_partition():
    from minipar.parallel.data.zero import partition

    minipar.init()
    fn = student("ex05_zero1_step", "partition")
    for sizes, world in (([5, 3, 3, 1], 2), ([10, 1, 1, 1, 7, 7], 3), ([4], 4), ([2, 2, 2], 1)):
        assert fn(sizes, world) == partition(sizes, world), f"{sizes} on {world} ranks"


def zero1_matches_adamw():
    import torch

    comm = minipar.init()
    torch_ref, _, model, ref = _setup("mlp")
    for p, q in zip(model.parameters(), ref.parameters()):
        p.grad = q.grad.clone()  # every rank: the full-batch gradient
    params = list(model.parameters())
    owner = student("ex05_zero1_step", "partition")([p.numel() for p in params], comm.size)
    mine = [p for p, r in zip(params, owner) if r == comm.rank]
    local = torch.optim.AdamW(mine, lr=0.01) if mine else None
    plain = torch.optim.AdamW(ref.parameters(), lr=0.01)
    student("ex05_zero1_step", "zero1_step")(params, owner, local)
    plain.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), f"{name} differs from a plain AdamW step"
    held = sum(v.numel() for s in (local.state.values() if local else ()) for v in s.values())
    assert held == sum(2 * p.numel() + 1 for p in mine), "state for parameters this rank owns"


def ex05_cases(size):
    return {
        "ex05_naive_ddp/matches_full_batch": naive_matches_full_batch,
        "ex05_bucketed_ddp/buckets": buckets_shape,
        "ex05_bucketed_ddp/matches_full_batch": bucketed_matches_full_batch,
        "ex05_zero1_step/partition": zero1_partition,
        "ex05_zero1_step/matches_adamw": zero1_matches_adamw,
    }
