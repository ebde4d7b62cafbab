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


def _element(t, flat_index: int) -> str:
    """'[2, 5]': the index of flat element `flat_index` in a tensor of t's shape."""
    import numpy as np

    return str([int(j) for j in np.unravel_index(flat_index, tuple(t.shape))]) if t.dim() else "[]"


def grad_where(torch, model, ref, size, buckets=None) -> str | None:
    """The first trainable parameter whose .grad is not the full batch's, in words: its name, the
    bucket and byte range it has there (`buckets`: lists of parameters, as made), the first
    element that differs, and the ratio when every element is off by the same factor (the sum
    over the ranks is `size` times the average)."""
    named = [(n, p, q) for (n, p), q in zip(model.named_parameters(), ref.parameters())]
    for name, p, q in named:
        if not p.requires_grad or q.grad is None:
            continue
        if p.grad is None:
            return f"parameter {name}: .grad is None after your all-reduce"
        got, want = p.grad.reshape(-1), q.grad.reshape(-1)
        close = torch.isclose(got, want, rtol=1e-5, atol=1e-6)
        if bool(close.all()):
            continue
        i = int((~close).nonzero()[0])
        where = f"parameter {name} {tuple(p.shape)}"
        for b, bucket in enumerate(buckets or []):
            offset = 0
            for member in bucket:
                nbytes = member.numel() * member.element_size()
                if member is p:
                    where += f" (bucket {b}, bytes {offset}:{offset + nbytes} of its flat tensor)"
                offset += nbytes
        line = (
            f"{where}, element {_element(p.grad, i)}: your .grad holds {got[i].item():.6g}, the "
            f"full batch's {want[i].item():.6g}"
        )
        nonzero = want.abs() > 1e-6
        if bool(nonzero.any()):
            ratio = (got[nonzero] / want[nonzero]).mean().item()
            if torch.allclose(got, want * ratio, rtol=1e-4, atol=1e-6):
                why = {
                    float(size): f": the sum over {size} ranks, not the average (divide by the "
                    "group size)",
                    1 / size: ": divided by the group size twice?",
                }
                tip = next((w for k, w in why.items() if abs(ratio - k) < 1e-3), "")
                line += f" (every element {ratio:.4g} times the full batch's{tip})"
        return line
    return None


def _same_grads(torch, comm, model, ref, buckets=None):
    wrong = grad_where(torch, model, ref, comm.size, buckets)
    assert wrong is None, f"rank {comm.rank}, {wrong}"
    mine = [p.grad.numpy().tobytes() for p in model.parameters() if p.grad is not None]
    seen = comm.allgather_object(mine)
    differ = [r for r, s in enumerate(seen) if s != seen[0]]
    assert not differ, f"ranks {differ} hold other gradient bits than rank 0"


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


def _bucket_words(bucket, names, start: int) -> str:
    nbytes = sum(p.numel() * p.element_size() for p in bucket)
    return f"[{', '.join(names[id(p)] for p in bucket)}] (bytes {start}:{start + nbytes})"


def buckets_shape():
    import torch
    from torch import nn

    from minipar.parallel.data.ddp import make_buckets as reference

    minipar.init()
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 64), nn.Linear(64, 4))
    params = list(model.parameters())
    names = {id(p): n for n, p in model.named_parameters()}
    for cap in (0, 100, 288, 300, 1 << 20):  # 288: 0.bias and 0.weight fill it exactly
        got = student("ex05_bucketed_ddp", "make_buckets")(params, cap)
        want = [b.params for b in reference(params[::-1], cap)]
        start = 0
        for b in range(max(len(got), len(want))):
            mine = got[b] if b < len(got) else []
            theirs = want[b] if b < len(want) else []
            assert [id(p) for p in mine] == [id(p) for p in theirs], (
                f"cap {cap} B, bucket {b}: yours holds {_bucket_words(mine, names, start)}, the "
                f"reference {_bucket_words(theirs, names, start)} (bytes count the gradients "
                "laid end to end in reverse registration order)"
            )
            start += sum(p.numel() * p.element_size() for p in theirs)
    assert torch.is_tensor(params[0])


def bucketed_matches_full_batch():
    torch, comm, model, ref = _setup()
    made = student("ex05_bucketed_ddp", "make_buckets")(model.parameters(), 400)
    with minipar.trace() as t:
        n = student("ex05_bucketed_ddp", "all_reduce_bucketed")(model.parameters(), 400)
    _same_grads(torch, comm, model, ref, made)
    calls = [c for c in t.calls if c.collective == "all_reduce"]
    assert len(calls) == n > 1, f"{len(calls)} all-reduces for {n} buckets"


def zero1_partition():
    from minipar.parallel.data.zero import partition

    minipar.init()
    fn = student("ex05_zero1_step", "partition")
    for sizes, world in (([5, 3, 3, 1], 2), ([10, 1, 1, 1, 7, 7], 3), ([4], 4), ([2, 2, 2], 1)):
        got, want = fn(sizes, world), partition(sizes, world)
        wrong = [i for i in range(len(sizes)) if i >= len(got) or got[i] != want[i]]
        assert not wrong, (
            f"sizes {sizes} on {world} ranks, parameter {wrong[0]} ({sizes[wrong[0]]} elements): "
            f"yours gives it to rank {got[wrong[0]] if wrong[0] < len(got) else None}, the "
            f"reference to rank {want[wrong[0]]} (owners yours {got}, the reference {want}; "
            f"elements per rank yours {_loads(sizes, got, world)}, the reference "
            f"{_loads(sizes, want, world)})"
        )


def _loads(sizes, owner, world):
    load = [0] * world
    for n, r in zip(sizes, owner):
        if isinstance(r, int) and 0 <= r < world:
            load[r] += n
    return load


def _roots(comm, trace) -> list:
    """The root of each broadcast this step made, as every rank saw them (the rank that
    received nothing; None where the ranks disagree)."""
    calls = [c for c in trace.calls if c.collective == "broadcast"]
    received = [any(m.kind == "recv" for m in c.messages) for c in calls]
    everyone = comm.allgather_object(received)
    roots = []
    for i in range(min(len(e) for e in everyone)):
        quiet = [r for r, e in enumerate(everyone) if not e[i]]
        roots.append(quiet[0] if len(quiet) == 1 else None)
    return roots


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
    with minipar.trace() as t:
        student("ex05_zero1_step", "zero1_step")(params, owner, local)
    plain.step()
    roots = _roots(comm, t) if comm.size > 1 else owner
    names = [n for n, _ in model.named_parameters()]
    for i, ((name, p), q) in enumerate(zip(model.named_parameters(), ref.parameters())):
        if torch.equal(p, q):
            continue
        said = f"rank {comm.rank}, parameter {i} ({name}, the shard of rank {owner[i]})"
        if i < len(roots) and roots[i] != owner[i]:
            raise AssertionError(
                f"{said}: broadcast {i} of your step came from rank {roots[i]}; the reference "
                f"broadcasts parameter {i} from its owner, rank {owner[i]} (roots yours "
                f"{roots}, the owners {owner})"
            )
        raise AssertionError(
            f"{said}: differs from a plain AdamW step ({len(roots)} broadcasts for "
            f"{len(names)} parameters)"
        )
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
