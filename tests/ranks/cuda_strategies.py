"""DDP, FSDP, tensor- and pipeline-parallel steps on each rank's device (minipar.device(): a GPU
where there is one, shared by several ranks if need be), each against the single-device model
trained on the whole batch in the same process, on the same device.

Run by tests/test_cuda.py (GPU only) and by scripts/gpu_check.sh; `gpu_check.sh --cpu-dry-run`
runs the same cases on the CPU, which proves the driver, not the GPU path. TF32 is off so that
the GPU computes float32 matmuls in float32; tolerances as in the CPU suites: rtol 1e-5 on
parameters after DDP/FSDP (same sums in another order; 1e-4 on a GPU, whose kernels may sum in
yet another order), 1e-5 of the largest magnitude for TP, rtol 1e-5 atol 1e-6 for PP gradients.
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn

import minipar

N, STEPS = 12, 3


def dev():
    minipar.init()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return minipar.device()


def rtol():
    return 1e-4 if dev().type == "cuda" else 1e-5


def mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 8)).to(dev())


def batch():
    g = torch.Generator().manual_seed(1234)
    return torch.randn(N, 12, generator=g).to(dev()), torch.randn(N, 8, generator=g).to(dev())


def mine(t, comm):
    b = N // comm.size
    return t[comm.rank * b : (comm.rank + 1) * b]


def reference_steps():
    """Rank 0's initial model, full batch, one device: parameters after each step."""
    model = mlp(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batch()
    history = []
    for _ in range(STEPS):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return history


def check_steps(wrapper_cls, what, **kwargs):
    comm = minipar.init()
    want = reference_steps()
    model = mlp(comm.rank)  # different seeds: the construction-time broadcast must fix it
    wrapped = wrapper_cls(model, **kwargs)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    x, y = batch()
    for step in range(STEPS):
        opt.zero_grad()
        F.mse_loss(wrapped(mine(x, comm)), mine(y, comm)).backward()
        opt.step()
        got = [p.detach() for p in _full_params(wrapped, model)]
        for i, (a, b) in enumerate(zip(got, want[step])):
            assert a.device == dev(), f"{what}: parameter {i} on {a.device}, not {dev()}"
            where = f"{what} step {step} param {i}"
            torch.testing.assert_close(
                a, b, rtol=rtol(), atol=1e-6, msg=lambda m, w=where: f"{w}: {m}"
            )


def _full_params(wrapped, model):
    gather = getattr(wrapped, "gather_full_params", None)  # FSDP: every rank holds a shard
    return list(gather().values()) if callable(gather) else list(model.parameters())


def ddp():
    from minipar.parallel import DistributedDataParallel

    check_steps(DistributedDataParallel, "DDP on " + str(dev()), bucket_cap_mb=0.0002)


def fsdp():
    from minipar.parallel import FullyShardedDataParallel

    check_steps(FullyShardedDataParallel, "FSDP on " + str(dev()))


def ddp_messages_on_device():
    """The gradient buckets DDP all-reduces live on the device, and the ledger says how they
    crossed: 'direct' (CUDA-aware MPI), 'staged' or 'staged-pipelined' on a GPU; 'host' on CPU."""
    from minipar.parallel import DistributedDataParallel

    comm = minipar.init()
    wrapped = DistributedDataParallel(mlp(comm.rank))
    x, y = batch()
    with minipar.trace() as t:
        F.mse_loss(wrapped(mine(x, comm)), mine(y, comm)).backward()
    paths = set(t.paths())
    if comm.size > 1:
        assert paths, "DDP sent nothing"
    allowed = {"host"} if dev().type == "cpu" else {"direct", "staged", "staged-pipelined"}
    if comm.backend == "mpi":
        assert paths <= allowed, (paths, allowed)


def tensor_parallel():
    from minipar.parallel.tensor import DenseMLP, ParallelMLP

    minipar.init()
    torch.manual_seed(7)
    dense = DenseMLP(24, 48, True).to(dev())
    parallel = ParallelMLP.from_dense(dense)
    torch.manual_seed(8)
    x = torch.randn(2, 12, 24, device=dev())
    dy = torch.randn(2, 12, 24, device=dev())
    xd, xp = x.clone().requires_grad_(), x.clone().requires_grad_()
    yd, yp = dense(xd), parallel(xp)
    (yd * dy).sum().backward()
    (yp * dy).sum().backward()
    for what, a, b in (("output", yp, yd), ("input grad", xp.grad, xd.grad)):
        assert a.device == dev()
        scale = b.abs().max().item() or 1.0
        err = (a.detach() - b.detach()).abs().max().item()
        assert err <= 1e-5 * scale * (10 if dev().type == "cuda" else 1), (what, err, scale)


def pipeline_parallel():
    from minipar.parallel.pipeline import Pipeline, split

    w = minipar.init()
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(w.size)]
    model = nn.Sequential(*layers).to(dev())
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 6, generator=g).to(dev()), torch.randn(8, 6, generator=g).to(dev())
    for schedule in ("gpipe", "1f1b"):
        for q in list(model.parameters()) + list(reference.parameters()):
            q.grad = None
        pipe = Pipeline(split(model, w.size)[w.rank], n_microbatches=4, schedule=schedule,
                        loss_fn=F.mse_loss)  # fmt: skip
        loss = pipe.step(x if w.rank == 0 else None, y if w.rank == w.size - 1 else None)
        ref = F.mse_loss(reference(x), y)
        ref.backward()
        if w.rank == w.size - 1:
            torch.testing.assert_close(loss, ref.detach(), rtol=rtol(), atol=1e-6)
        for (name, q), r in zip(model.named_parameters(), reference.parameters()):
            if q.grad is not None:
                assert q.grad.device == dev()
                where = f"PP {schedule} {name}"
                torch.testing.assert_close(q.grad, r.grad, rtol=rtol(), atol=1e-6,
                                           msg=lambda m, w=where: f"{w}: {m}")  # fmt: skip


def cases(size):
    return {
        "ddp": ddp,
        "fsdp": fsdp,
        "ddp_messages_on_device": ddp_messages_on_device,
        "tensor_parallel": tensor_parallel,
        "pipeline_parallel": pipeline_parallel,
    }
