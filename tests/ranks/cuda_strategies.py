"""DDP, FSDP, tensor-, pipeline-, context- and expert-parallel steps on each rank's device
(minipar.device(): a GPU where there is one, shared by several ranks if need be), each against
the single-device model (or dense attention, or the dense mixture of experts) on the whole
batch in the same process, on the same device.

Run by tests/test_cuda.py (GPU only) and by scripts/gpu_check.sh; `gpu_check.sh --cpu-dry-run`
runs the same cases on the CPU, which proves the driver, not the GPU path. TF32 is off so that
the GPU computes float32 matmuls in float32; tolerances as in the CPU suites: rtol 1e-5 on
parameters after DDP/FSDP (same sums in another order; 1e-4 on a GPU, whose kernels may sum in
yet another order), 1e-5 of the largest magnitude for TP, rtol 1e-5 atol 1e-6 for PP gradients,
1e-5 (1e-4 on a GPU) of the largest magnitude for the context- and expert-parallel outputs and
gradients."""

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
    crossed: 'direct' (CUDA-aware MPI), 'staged' or 'staged-pipelined' on a GPU; 'host' on CPU.
    One exchange stays on the host by design: the used-parameter flags (one uint8 a parameter,
    control data that would cost a staging copy each way on a GPU)."""
    from minipar.parallel import DistributedDataParallel

    comm = minipar.init()
    model = mlp(comm.rank)
    wrapped = DistributedDataParallel(model)
    x, y = batch()
    with minipar.trace() as t:
        F.mse_loss(wrapped(mine(x, comm)), mine(y, comm)).backward()
    if comm.size == 1 or comm.backend != "mpi":
        return
    on_device = {"host"} if dev().type == "cpu" else {"direct", "staged", "staged-pipelined"}
    flags = len(list(model.parameters()))  # bytes of the used-parameter flags
    sent = [m for m in t.messages if m.kind == "send"]
    gradients = sum(m.nbytes for m in sent if m.path in on_device and m.nbytes > flags)
    grad_bytes = sum(q.numel() * q.element_size() for q in model.parameters())
    # any all-reduce sends at least (p-1)/p of the buffer from every rank
    assert gradients >= grad_bytes * (comm.size - 1) // comm.size, (gradients, grad_bytes)
    others = {(m.path, m.nbytes) for m in sent if m.path not in on_device}
    assert all(path == "host" and n <= flags for path, n in others), (others, on_device)


def close(actual, expected, what):
    """Within 1e-5 (1e-4 on a GPU) of the expected tensor's largest magnitude, on the device."""
    assert actual.device == dev(), f"{what}: on {actual.device}, not {dev()}"
    scale = expected.abs().max().item() or 1.0
    err = (actual.detach() - expected.detach()).abs().max().item() if actual.numel() else 0.0
    assert err <= rtol() * scale, f"{what}: max error {err:.3g} > {rtol()} x {scale:.3g}"


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
    close(yp, yd, "TP output")
    close(xp.grad, xd.grad, "TP input gradient")


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


def context_parallel():
    """Ring and Ulysses attention, causal and not, on device-resident q, k, v shards: this
    rank's output and q, k, v gradients against its shard of dense attention on the device."""
    from minipar.parallel.context import (
        ring_attention,
        shard_sequence,
        ulysses_attention,
        unshard_sequence,
    )

    w = minipar.init()
    g = torch.Generator().manual_seed(3)
    full = [torch.randn(2, 4, 8 * w.size, 8, generator=g).to(dev()) for _ in range(4)]
    for name, attend in (("ring", ring_attention), ("ulysses", ulysses_attention)):
        for causal in (False, True):
            q, k, v = (t.clone().requires_grad_() for t in full[:3])
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            out.backward(full[3])
            cut = [shard_sequence(t, 2, causal=causal).detach() for t in full]
            mine_ = [t.clone().requires_grad_() for t in cut[:3]]
            got = attend(*mine_, causal=causal)
            got.backward(cut[3])
            what = f"{name} causal={causal}"
            close(unshard_sequence(got.detach(), 2, causal=causal), out, what + " output")
            for t, ref, label in zip(mine_, (q, k, v), "qkv"):
                close(t.grad, shard_sequence(ref.grad, 2, causal=causal), f"{what} d{label}")


def expert_parallel():
    """A mixture of experts on the device, experts split over the ranks (MoE.from_dense of a
    DenseMoE built there): this rank's tokens' outputs and input gradients against the dense
    layer's on all the ranks' tokens, and every parameter on the device."""
    from minipar.parallel.expert import DenseMoE, MoE

    w = minipar.init()
    torch.manual_seed(7)
    dense = DenseMoE(12, 16, 8, top_k=2).to(dev())
    moe = MoE.from_dense(dense)
    for name, q in moe.named_parameters():
        assert q.device == dev(), f"MoE.{name} on {q.device}, not {dev()}"
    g = torch.Generator().manual_seed(4)
    x, dy = (torch.randn(6 * w.size, 12, generator=g).to(dev()) for _ in range(2))
    sizes = [6] * w.size
    xd = x.clone().requires_grad_()
    dense(xd, groups=sizes).backward(dy)
    rows = slice(6 * w.rank, 6 * (w.rank + 1))
    xm = x[rows].clone().requires_grad_()
    ym = moe(xm)
    ym.backward(dy[rows])
    close(ym, dense(x, groups=sizes)[rows], "MoE output")
    close(xm.grad, xd.grad[rows], "MoE input gradient")


MESH_LAYOUTS = {  # (dp, tp, pp, cp, ep, experts): every axis on the device at least once
    2: [(2, 1, 1, 1, 1, 0), (1, 2, 1, 1, 1, 0), (1, 1, 2, 1, 1, 0), (1, 1, 1, 2, 1, 0)],
    4: [(2, 2, 1, 1, 1, 0), (1, 2, 2, 1, 1, 0), (1, 1, 2, 2, 1, 0), (4, 1, 1, 1, 2, 4)],
}


def gpt_mesh():
    """The tiny GPT trained on a mesh on the device, layout by layout: the first step's
    synchronised gradients (gathered dense) against the dense model's on the whole batch (on
    the CPU), and the two steps' losses against the dense run's."""
    import dataclasses

    from minipar.models import GPTConfig, training
    from minipar.models.config import RunSpec

    w = minipar.init()
    tiny = GPTConfig(seq_len=16, hidden=32, n_layers=4, n_heads=8)
    for dp, tp, pp, cp, ep, experts in MESH_LAYOUTS.get(w.size, []):
        model = dataclasses.replace(tiny, n_experts=experts)
        spec = RunSpec(dp, tp, pp, 2, "1f1b", False, steps=2, model=model, cp=cp, ep=ep)
        grads = {}

        def keep(step, part, into=grads):
            if not into:
                into.update(part.dense_grads())

        mesh = training.mesh_for(spec)
        losses, part, _ = training.train_on_mesh(spec, mesh, device=dev(), on_grads=keep)
        assert all(q.device == dev() for q in part.parameters()), spec.layout
        dense = RunSpec(microbatches=1, steps=2, model=model)
        want, _, _ = training.train_dense(dense)
        problems = training.compare_gradients(grads, training.dense_gradients(dense), rtol())
        assert not problems, f"{spec.layout} on {dev()}: " + "; ".join(problems)
        for step, (a, b) in enumerate(zip(losses, want)):
            assert abs(a - b) <= 1e-5 + rtol() * abs(b), (spec.layout, step, a, b)


def cases(size):
    return {
        "ddp": ddp,
        "fsdp": fsdp,
        "ddp_messages_on_device": ddp_messages_on_device,
        "tensor_parallel": tensor_parallel,
        "pipeline_parallel": pipeline_parallel,
        "context_parallel": context_parallel,
        "expert_parallel": expert_parallel,
        "gpt_mesh": gpt_mesh,
    }
