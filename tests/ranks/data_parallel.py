"""DDP, ZeRO-1 and FSDP on real ranks, against one process training on the whole batch.

Every case runs with warnings as errors and deterministic algorithms (see `deterministic`).
Each rank builds its model from a different seed, so the construction-time broadcast is tested
too; the reference is rank 0's initial model trained on the full batch in this same process.

Tolerances: fp32 DDP/FSDP rtol 1e-5 atol 1e-6 (p per-rank means averaged: the same sum in a
different order), bitwise with one rank; ZeRO-1 alone is bitwise (same arithmetic per parameter);
fp16/bf16 compute within 1e-4 of a single process computing in the same dtype.
"""

import copy
import functools
import warnings

import torch
from torch import nn

import minipar
from minipar.parallel import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    ZeroRedundancyOptimizer,
)

N = 12  # full batch: divisible by 1, 2, 3 and 4 ranks
STEPS = 3


class Tied(nn.Module):
    """Tied embedding/head, a frozen layer, and a parameter that never gets a gradient."""

    def __init__(self, vocab=11, d=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.proj = nn.Linear(d, d)
        self.frozen = nn.Linear(d, d)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.unused = nn.Parameter(torch.ones(3))

    def forward(self, tokens):
        h = torch.tanh(self.proj(self.emb(tokens)))
        return self.head(self.frozen(h) + h)


class Branchy(nn.Module):
    """A branch some ranks skip: its parameters get no gradient there."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.branch = nn.Linear(6, 6)
        self.b = nn.Linear(6, 2)

    def forward(self, x, use_branch):
        h = torch.tanh(self.a(x))
        if use_branch:
            h = h + self.branch(h)
        return self.b(h)


def build(kind, seed):
    torch.manual_seed(seed)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 24))
    if kind == "tied":
        return Tied()
    return Branchy()


def batch(kind, seed=1234):
    g = torch.Generator().manual_seed(seed)
    if kind == "tied":
        x = torch.randint(0, 11, (N, 5), generator=g)
        return x, torch.randint(0, 11, (N, 5), generator=g)
    width = 12 if kind == "mlp" else 6
    return torch.randn(N, width, generator=g), torch.randn(
        N, 24 if kind == "mlp" else 2, generator=g
    )


def loss_of(kind, out, y):
    if kind == "tied":
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
    return ((out.float() - y) ** 2).mean()


def local(t, comm):
    b = N // comm.size
    return t[comm.rank * b : (comm.rank + 1) * b]


def optimizer(name, params, lr_scale=1.0):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1 * lr_scale, momentum=0.9, weight_decay=0.01)
    return torch.optim.AdamW(params, lr=0.01 * lr_scale, weight_decay=0.1)


# bf16 gradients carry ~4e-3 relative rounding that depends on how the batch is split, so the
# 1e-4 bound on parameters holds for steps of lr 3e-3 (SGD), not 0.1
LOW_PRECISION_LR_SCALE = 0.03


def reference(kind, opt_name, steps=STEPS, dtype=None, seed=0):
    """Rank 0's initial model (built from `seed`), full batch, one process: parameters after
    each step."""
    model = build(kind, seed)
    opt = optimizer(opt_name, model.parameters(), LOW_PRECISION_LR_SCALE if dtype else 1.0)
    x, y = batch(kind)
    history = []
    for _ in range(steps):
        opt.zero_grad()
        if dtype is None:
            out = model(x)
        else:  # the same mixed precision as FSDP: every weight and input cast to dtype
            cast = {n: p.to(dtype) for n, p in model.named_parameters()}
            xin = x.to(dtype) if x.is_floating_point() else x
            out = torch.func.functional_call(model, cast, (xin,))
        loss_of(kind, out, y).backward()
        opt.step()
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return history


def assert_params(named, want, comm, what, rtol=1e-5, atol=1e-6):
    for name, p in named.items():
        if comm.size == 1 and rtol < 1e-4:
            assert torch.equal(p, want[name]), f"{what}: {name} differs on one rank"
        else:
            torch.testing.assert_close(
                p, want[name], rtol=rtol, atol=atol, msg=lambda m, name=name: f"{what}: {name}\n{m}"
            )


def same_on_every_rank(tensors, comm, what):
    mine = [t.detach().numpy().tobytes() for t in tensors]
    seen = comm.allgather_object(mine)
    assert all(s == seen[0] for s in seen), f"{what} differ across ranks"


@functools.cache
def deterministic() -> None:
    """torch.use_deterministic_algorithms(True) on 2 ranks; elsewhere only the switch it flips
    for eager code (the public function also imports torch's compiler config: ~1.5 s a rank)."""
    if minipar.init().size == 2:
        torch.use_deterministic_algorithms(True)
    else:
        torch._C._set_deterministic_algorithms(True)
    assert torch.are_deterministic_algorithms_enabled()


def quiet(fn):
    """The case with warnings as errors, under deterministic algorithms."""

    @functools.wraps(fn)
    def case():
        deterministic()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fn()

    return case


# -- DDP ------------------------------------------------------------------------------------


def ddp_training(kind, opt_name):
    @quiet
    def case():
        comm = minipar.init()
        want = reference(kind, opt_name)
        x, y = batch(kind)
        # one bucket and per parameter with SGD, several small buckets with AdamW
        for cap in (25, 0) if opt_name == "sgd" else (0.0004,):
            model = build(kind, comm.rank)  # different seeds: the broadcast must fix it
            ddp = DistributedDataParallel(model, bucket_cap_mb=cap)
            opt = optimizer(opt_name, ddp.parameters())
            for step in range(STEPS):
                opt.zero_grad()
                loss_of(kind, ddp(local(x, comm)), local(y, comm)).backward()
                grads = [p.grad for p in ddp.parameters() if p.grad is not None]
                same_on_every_rank(grads, comm, "gradients")
                if kind == "tied":
                    assert model.unused.grad is None and model.frozen.weight.grad is None
                opt.step()
                named = dict(model.named_parameters())
                assert_params(named, want[step], comm, f"DDP cap={cap} step {step}")
            assert cap != 25 or len(ddp.buckets) == 1
            assert cap != 0.0004 or len(ddp.buckets) > 1
            assert cap != 0 or len(ddp.buckets) == len(
                [p for p in ddp.parameters() if p.requires_grad]
            )

    return case


@quiet
def ddp_no_sync():
    """Two micro-batches, the first under no_sync: the sum is reduced once, at the second."""
    comm = minipar.init()
    x, y = batch("mlp")
    ref = build("mlp", 0)
    ((ref(x) - y) ** 2).mean().backward()
    ddp = DistributedDataParallel(build("mlp", comm.rank), bucket_cap_mb=0.0004)
    xl, yl = local(x, comm), local(y, comm)
    half = len(xl) // 2
    with minipar.trace() as t:
        with ddp.no_sync():
            (((ddp(xl[:half]) - yl[:half]) ** 2).sum() / len(xl) / y.shape[1]).backward()
    assert t.bytes_sent() == 0, "no_sync moved bytes"
    (((ddp(xl[half:]) - yl[half:]) ** 2).sum() / len(xl) / y.shape[1]).backward()
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)


@quiet
def ddp_unused_on_some_ranks():
    """Rank 0 uses a branch the others skip; a second model never uses it at all."""
    comm = minipar.init()
    x, y = batch("branchy")
    for rank0_uses in (True, False):
        ref = build("branchy", 0)
        total = 0
        for r in range(comm.size):
            b = N // comm.size
            xs, ys = x[r * b : (r + 1) * b], y[r * b : (r + 1) * b]
            total = total + ((ref(xs, rank0_uses and r == 0) - ys) ** 2).mean() / comm.size
        total.backward()
        ddp = DistributedDataParallel(build("branchy", comm.rank), bucket_cap_mb=0.0001)
        for _ in range(2):  # the second step checks the buckets were left clean
            for p in ddp.parameters():
                p.grad = None
            out = ddp(local(x, comm), rank0_uses and comm.rank == 0)
            ((out - local(y, comm)) ** 2).mean().backward()
            for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
                if q.grad is None:
                    assert p.grad is None, f"{name}: globally unused but got a gradient"
                else:
                    torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)


@quiet
def ddp_explicit_finish_idempotent():
    comm = minipar.init()
    x, y = batch("mlp")
    ddp = DistributedDataParallel(build("mlp", comm.rank))
    loss_of("mlp", ddp(local(x, comm)), local(y, comm)).backward()
    before = [p.grad.clone() for p in ddp.parameters()]
    with minipar.trace() as t:
        ddp.finish_gradient_synchronization()  # backward already finished it
    assert t.bytes_sent() == 0
    assert all(torch.equal(a, p.grad) for a, p in zip(before, ddp.parameters()))


@quiet
def ddp_ledger():
    """Ring: 2 (p-1)/p of the gradient bytes per rank per step (plus the 1-byte used map)."""
    comm = minipar.init()
    x, y = batch("mlp")
    ddp = DistributedDataParallel(build("mlp", comm.rank), algorithm="ring")
    grad_bytes = 4 * sum(p.numel() for p in ddp.parameters())
    with minipar.trace() as t:
        loss_of("mlp", ddp(local(x, comm)), local(y, comm)).backward()
    buckets = [c for c in t.calls if c.collective == "all_reduce" and c.algorithm == "ring"]
    assert len(buckets) == 1
    p = comm.size
    assert sum(c.bytes_sent for c in buckets) == 2 * (p - 1) * grad_bytes // p
    used_map = [c for c in t.calls if c not in buckets]
    assert len(used_map) == 1 and used_map[0].bytes_sent <= 4 * len(list(ddp.parameters())) * p


@quiet
def ddp_across_nodes_takes_two_levels():
    """A bucket of 1 MiB with algorithm="auto": on one node the ring (the windows' order); on
    2 nodes of 2 (emulated ones, or a node map set here; a 2 Gbit/s link between) the cost
    model's choice on both links, a two-level all-reduce (plain or pipelined); the average
    right and bitwise the same on every rank either way."""
    from minipar import cost
    from minipar.collectives import hierarchical
    from minipar.runtime import nodes
    from minipar.state import process

    comm = minipar.init()
    saved_nodes, saved_links, fast = process.nodes, dict(process.links), process.fast_paths
    cost.set_default_link(cost.SHARED_MEMORY)  # not this machine's calibration
    cost.set_inter_link(cost.Link("2 Gbit/s", 50e-6, 1 / 0.25e9, 1 / 5e9))
    try:
        maps = [("this job's nodes", saved_nodes)]
        if comm.size == 4:
            maps.append(("2x2", nodes.from_keys([(n, f"node{n}") for n in (0, 0, 1, 1)], "test")))
        for label, owner in maps:
            process.nodes = owner
            across = hierarchical.shape(comm) is not None
            # a map set here, ranks on one machine: no shared window, as across real nodes
            process.fast_paths = fast and owner is saved_nodes
            torch.manual_seed(0)
            model = nn.Linear(512, 512, bias=False)  # 1 MiB of gradient: one bucket
            ddp = DistributedDataParallel(copy.deepcopy(model))
            x = torch.randn(8, 512, generator=torch.Generator().manual_seed(comm.rank))
            with minipar.trace() as t:
                ddp(x).square().sum().backward()
            got = [c.algorithm for c in t.calls if c.bytes_sent > 1 << 18]  # not the used map
            two = ("hierarchical", "hierarchical_pipelined")
            assert len(got) == 1, f"{label}: {got}"
            assert got[0] in two if across else got[0].split("@")[0] == "ring", f"{label}: {got}"
            model(x).square().sum().backward()
            want = torch.stack(comm.allgather_object(model.weight.grad)).mean(0)
            torch.testing.assert_close(ddp.module.weight.grad, want, rtol=1e-5, atol=1e-6)
            seen = comm.allgather_object(ddp.module.weight.grad)
            assert all(torch.equal(g, seen[0]) for g in seen), f"{label}: ranks differ"
    finally:
        process.nodes, process.fast_paths = saved_nodes, fast
        process.links.clear()
        process.links.update(saved_links)


@quiet
def ddp_skips_expert_parameters():
    """A parameter marked expert_parallel keeps this rank's value (no broadcast) and this rank's
    gradient (no average): the ledger's buckets hold the other parameters' bytes only."""
    comm = minipar.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))
    expert = model[1].weight
    expert.expert_parallel = True
    with torch.no_grad():
        expert.fill_(0.1 * (comm.rank + 1))  # each rank its own expert
        model[0].weight.fill_(comm.rank)  # replicated: rank 0's must win
    ddp = DistributedDataParallel(model, algorithm="ring")
    assert (expert == 0.1 * (comm.rank + 1)).all() and (model[0].weight == 0).all()
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(comm.rank))
    alone = copy.deepcopy(model)
    alone(x).square().sum().backward()
    with minipar.trace() as t:
        ddp(x).square().sum().backward()
    assert torch.equal(expert.grad, alone[1].weight.grad), "the expert's gradient was reduced"
    want = torch.stack(comm.allgather_object(alone[0].weight.grad)).mean(0)
    torch.testing.assert_close(model[0].weight.grad, want, rtol=1e-5, atol=1e-6)
    shared = 4 * sum(q.numel() for q in model.parameters() if q is not expert)
    buckets = [c for c in t.calls if c.algorithm == "ring"]
    p = comm.size
    assert sum(c.bytes_sent for c in buckets) == (2 * (p - 1) * shared // p if p > 1 else 0)


@quiet
def ddp_bad_inputs():
    comm = minipar.init()
    model = build("mlp", 0)
    if comm.size > 1 and comm.rank == comm.size - 1:
        model[2] = nn.Linear(12, 23)
    if comm.size > 1:
        try:
            DistributedDataParallel(model)
        except ValueError as e:
            text = str(e)
            assert "'2.weight'" in text and f"ranks [{comm.size - 1}]" in text, text
        else:
            raise AssertionError("mismatched models were accepted")
    for bad in (-1, "25"):
        try:
            DistributedDataParallel(build("mlp", 0), bucket_cap_mb=bad)
        except (TypeError, ValueError) as e:
            assert repr(bad) in str(e)
        else:
            raise AssertionError(f"bucket_cap_mb={bad!r} accepted")


@functools.cache
def gloo():
    import torch.distributed as dist
    from mpi4py import MPI

    from minipar.comm.transport.torch import init_from_mpi

    if not dist.is_initialized():
        init_from_mpi(MPI.COMM_WORLD)
    return dist


@quiet
def ddp_vs_torch_ddp():
    comm = minipar.init()
    gloo()
    x, y = batch("mlp")
    ours = DistributedDataParallel(build("mlp", comm.rank), bucket_cap_mb=0.0004)
    theirs = torch.nn.parallel.DistributedDataParallel(build("mlp", comm.rank))
    opts = [optimizer("adamw", m.parameters()) for m in (ours, theirs)]
    for step in range(STEPS):
        for model, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            loss_of("mlp", model(local(x, comm)), local(y, comm)).backward()
            opt.step()
        for (name, a), b in zip(ours.module.named_parameters(), theirs.module.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"step {step} {name}")


# -- ZeRO-1 ---------------------------------------------------------------------------------


@quiet
def zero_alone_bitwise():
    """Every rank computes the full-batch gradient; ZeRO's steps equal the plain optimizer's."""
    minipar.init()
    for kind, opt_name in (("mlp", "adamw"), ("tied", "sgd"), ("tied", "adamw")):
        want = reference(kind, opt_name)
        model = build(kind, 0)
        cls, kw = (
            (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01))
            if opt_name == "sgd"
            else (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1))
        )
        opt = ZeroRedundancyOptimizer(model.parameters(), cls, **kw)
        x, y = batch(kind)
        for step in range(STEPS):
            opt.zero_grad()
            loss_of(kind, model(x), y).backward()
            opt.step()
            for name, p in model.named_parameters():
                assert torch.equal(p, want[step][name]), f"ZeRO {kind} {opt_name} {name}"


@quiet
def zero_memory_and_state_dict():
    """State bytes per rank ~ K Psi / N_d (AdamW fp32: K = 8, plus a 4-byte step per tensor)."""
    comm = minipar.init()
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(8)])
    plain = copy.deepcopy(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=0.01)
    ref = torch.optim.AdamW(plain.parameters(), lr=0.01)
    x = torch.randn(4, 16)
    for m, o in ((model, opt), (plain, ref)):
        m(x).square().mean().backward()
        o.step()
    psi = sum(p.numel() for p in model.parameters())
    n_tensors = [sum(1 for r in opt.owner if r == q) for q in range(comm.size)]
    elements = [
        sum(p.numel() for p, r in zip(opt._all, opt.owner) if r == q) for q in range(comm.size)
    ]
    mine = opt.state_bytes()
    assert mine == 8 * elements[comm.rank] + 4 * n_tensors[comm.rank]
    # the partition's bound (tests/test_data_parallel.py): the most-loaded rank holds at most
    # the least-loaded one's elements plus the smallest parameter of its own shard
    top = elements.index(max(elements))
    smallest = min(p.numel() for p, r in zip(opt._all, opt.owner) if r == top)
    assert max(elements) - min(elements) <= smallest, ("unbalanced shards", elements, smallest)
    assert sum(comm.allgather_object(mine)) == 8 * psi + 4 * len(opt._all)
    state = opt.state_dict()
    want = ref.state_dict()
    assert state["param_groups"] == want["param_groups"]
    for i, s in want["state"].items():
        for k, v in s.items():
            assert torch.equal(state["state"][i][k], v), (i, k)
    fresh = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=0.5)
    fresh.load_state_dict(want)
    assert fresh.param_groups[0]["lr"] == 0.01
    for p, q in zip(model.parameters(), plain.parameters()):
        if fresh.optim is not None and p in fresh.optim.state:
            assert torch.equal(fresh.optim.state[p]["exp_avg"], ref.state[q]["exp_avg"])


@quiet
def zero_with_ddp():
    comm = minipar.init()
    want = reference("tied", "adamw")
    x, y = batch("tied")
    model = build("tied", comm.rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.0004)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.AdamW, lr=0.01, weight_decay=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        loss_of("tied", ddp(local(x, comm)), local(y, comm)).backward()
        opt.step()
        assert_params(dict(model.named_parameters()), want[step], comm, f"ZeRO+DDP {step}")
        same_on_every_rank(list(model.parameters()), comm, "parameters")


def zero_vs_torch_zero():
    """torch's ZeRO-1 (its own partition, gloo broadcasts) steps to the same bits."""
    with warnings.catch_warnings():  # torch's own module warns on import (torch.jit.script)
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
    minipar.init()
    gloo()
    x, y = batch("mlp")
    ours, theirs = build("mlp", 0), build("mlp", 0)
    o1 = ZeroRedundancyOptimizer(ours.parameters(), torch.optim.AdamW, lr=0.01)
    o2 = TorchZero(theirs.parameters(), torch.optim.AdamW, lr=0.01)
    for _ in range(STEPS):
        for m, o in ((ours, o1), (theirs, o2)):
            o.zero_grad()
            loss_of("mlp", m(x), y).backward()
            o.step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)


zero_vs_torch_zero = quiet(zero_vs_torch_zero)


# groups that do not start at world rank 0, of 4, 3 and 2 ranks; the first lists the world in
# reverse, so that no rank's group rank is its world rank (a mix-up of the two shows at once,
# on every rank)
OFFSET_GROUPS = ([3, 2, 1, 0], [1, 2, 3], [2, 3])
ZERO_KINDS = {
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
}


def my_offset_groups():
    """(world ranks, group) of each OFFSET_GROUPS group this rank is in (every rank creates
    every group: new_group is collective)."""
    me = minipar.get_rank()
    made = [(ranks, minipar.new_group(ranks)) for ranks in OFFSET_GROUPS]
    return [(ranks, group) for ranks, group in made if me in ranks]


@quiet
def zero_on_offset_groups():
    """ZeRO-1 alone on groups not starting at world rank 0: each step bitwise the plain
    optimizer's on one process, the state_dict the plain one's, and every shard broadcast from
    its owner (the ledger: a rank receives every parameter byte but those of its own shard)."""
    minipar.init()
    for ranks, group in my_offset_groups():
        for kind, opt_name in (("mlp", "adamw"), ("tied", "sgd")):
            cls, kw = ZERO_KINDS[opt_name]
            model, plain = build(kind, 0), build(kind, 0)
            opt = ZeroRedundancyOptimizer(model.parameters(), cls, group=group, **kw)
            ref = cls(plain.parameters(), **kw)
            x, y = batch(kind)
            total = sum(4 * p.numel() for p in opt._all)
            own = sum(4 * p.numel() for p, r in zip(opt._all, opt.owner) if r == group.rank)
            for step in range(STEPS):
                for m, o in ((model, opt), (plain, ref)):
                    o.zero_grad()
                    loss_of(kind, m(x), y).backward()
                with minipar.trace() as t:
                    opt.step()
                ref.step()
                for (name, p), q in zip(model.named_parameters(), plain.parameters()):
                    assert torch.equal(p, q), (
                        f"ZeRO on {ranks} {kind} {opt_name} step {step}: {name}"
                    )
                assert t.bytes_received("broadcast") == total - own, (ranks, t.bytes_received())
                assert len(t.calls) == len(set(opt.owner)), (ranks, len(t.calls), opt.owner)
            state, want = opt.state_dict(), ref.state_dict()
            assert state["param_groups"] == want["param_groups"]
            assert sorted(state["state"]) == sorted(want["state"]), ranks
            for i, s in want["state"].items():
                for k, v in s.items():
                    assert torch.equal(torch.as_tensor(state["state"][i][k]), torch.as_tensor(v))


@quiet
def ddp_fsdp_on_offset_groups():
    """DDP with ZeRO-1, and FSDP, on groups not starting at world rank 0, trained with SGD (a
    gradient off by a constant factor shows in the weights): each member takes its group rank's
    share of the batch, the models start from the group's rank 0 (world rank ranks[0], whose
    seed the reference uses), every step equals the one-process run."""
    comm = minipar.init()
    for ranks, group in my_offset_groups():
        want = reference("tied", "sgd", seed=ranks[0])
        x, y = batch("tied")
        n = len(ranks)
        share = slice(group.rank * N // n, (group.rank + 1) * N // n)
        model = build("tied", comm.rank)
        ddp = DistributedDataParallel(model, group=group, bucket_cap_mb=0.0004)
        cls, kw = ZERO_KINDS["sgd"]
        opt = ZeroRedundancyOptimizer(ddp.parameters(), cls, group=group, **kw)
        fsdp = FullyShardedDataParallel(build("tied", comm.rank), group=group)
        opt2 = optimizer("sgd", fsdp.parameters())
        for step in range(STEPS):
            for m, o in ((ddp, opt), (fsdp, opt2)):
                o.zero_grad()
                loss_of("tied", m(x[share]), y[share]).backward()
                o.step()
            what = f"on {ranks} step {step}"
            assert_params(dict(model.named_parameters()), want[step], group, f"DDP+ZeRO {what}")
            assert_params(fsdp.gather_full_params(), want[step], group, f"FSDP {what}")


@quiet
def zero_bad_class():
    minipar.init()
    for bad in ("adam", torch.optim.AdamW([nn.Parameter(torch.ones(1))]), nn.Linear):
        try:
            ZeroRedundancyOptimizer(build("mlp", 0).parameters(), bad, lr=0.1)
        except TypeError as e:
            assert "optimizer_class" in str(e) and repr(bad)[:20] in str(e)
        else:
            raise AssertionError(f"{bad!r} accepted as an optimizer class")


# -- FSDP -----------------------------------------------------------------------------------


def fsdp_training(kind, opt_name, dtype=None, shard_modules=None):
    @quiet
    def case():
        comm = minipar.init()
        want = reference(kind, opt_name, dtype=dtype)
        x, y = batch(kind)
        model = build(kind, comm.rank)
        names = [n for n, _ in build(kind, 0).named_parameters()]
        fsdp = FullyShardedDataParallel(model, compute_dtype=dtype, shard_modules=shard_modules)
        opt = optimizer(opt_name, fsdp.parameters(), LOW_PRECISION_LR_SCALE if dtype else 1.0)
        tol = dict(rtol=1e-4, atol=1e-4) if dtype else dict(rtol=1e-5, atol=1e-6)
        for step in range(STEPS):
            opt.zero_grad()
            loss_of(kind, fsdp(local(x, comm)), local(y, comm)).backward()
            for p in fsdp.parameters():
                assert p.grad is None or (p.grad.shape == p.shape and p.grad.dtype == p.dtype)
            opt.step()
            full = fsdp.gather_full_params()
            assert list(full) == names
            assert_params(full, want[step], comm, f"FSDP {kind} {dtype} step {step}", **tol)
        assert all(u.full is None for u in fsdp.units), "a unit kept its full parameters"

    return case


@quiet
def fsdp_ledger():
    """fp32: all-gather twice and reduce-scatter once: 1.5x DDP's ring all-reduce bytes. The
    input requires grad, so backward needs every weight (else the first layer's weight is never
    saved, and FSDP rightly skips gathering it again)."""
    comm = minipar.init()
    x, y = batch("mlp")
    x.requires_grad_(True)
    fsdp = FullyShardedDataParallel(build("mlp", 0))
    with minipar.trace() as t:
        loss_of("mlp", fsdp(local(x, comm)), local(y, comm)).backward()
    psi = 4 * sum(u.numel for u in fsdp.units)
    ddp_bytes = 2 * (comm.size - 1) * psi // comm.size
    gathers = t.bytes_sent("all_gather")
    assert gathers == ddp_bytes, (gathers, ddp_bytes)
    assert t.bytes_sent("reduce_scatter") == ddp_bytes // 2
    assert t.bytes_sent() == 3 * ddp_bytes // 2


@quiet
def auto_reductions_by_node():
    """What `auto` runs for DDP's bucket and FSDP's reduce-scatter above 64 KiB: the ring on one
    node (the window's order); across N equal nodes of k ranks the two-level schemes, whose
    bytes out of a node are 2 (N-1)/N Psi for DDP's all-reduce and 3 (N-1)/N Psi for FSDP's
    gathers and reduce-scatter (the flat ring's would be 2 (p-1)/p and 3 (p-1)/p Psi)."""
    comm = minipar.init()
    if comm.size == 1:
        return  # nothing to reduce
    torch.manual_seed(0)
    wide = nn.Sequential(nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 128))  # 2 x 66 KiB
    x = torch.randn(N, 128, generator=torch.Generator().manual_seed(comm.rank), requires_grad=True)
    node_of = minipar.node_map()
    nodes, p = len(set(node_of)), comm.size
    for strategy, passes in ((DistributedDataParallel, 2), (FullyShardedDataParallel, 3)):
        model = strategy(copy.deepcopy(wide))
        with minipar.trace() as t:
            model(x).square().mean().backward()
        big = [c for c in t.calls if c.collective in ("all_reduce", "reduce_scatter")
               and c.bytes_sent > 1024]  # fmt: skip
        algorithms = {c.algorithm.split("@")[0] for c in big}  # ring@shm: in the window
        psi = 4 * p * sum(-(-q.numel() // p) for q in wide.parameters())  # FSDP pads to p
        out = {}
        for node, sent in zip(node_of, comm.allgather_object(t.bytes_sent(link="inter"))):
            out[node] = out.get(node, 0) + sent
        if nodes == 1:
            assert algorithms == {"ring"}, (strategy.__name__, algorithms)
            assert out == {node_of[0]: 0}, out
            continue
        assert all(a.startswith("hierarchical") for a in algorithms), algorithms
        if strategy is DistributedDataParallel:
            psi = 4 * sum(q.numel() for q in wide.parameters())  # one bucket, unpadded
        for node, sent in out.items():  # + the 1-byte used map's few bytes, DDP's
            want = passes * (nodes - 1) / nodes * psi
            assert want <= sent <= want + 64, (strategy.__name__, node, sent, want)


@quiet
def fsdp_bad_inputs():
    minipar.init()
    for bad in (torch.int32, "float16", torch.bool):
        try:
            FullyShardedDataParallel(build("mlp", 0), compute_dtype=bad)
        except TypeError as e:
            assert repr(bad) in str(e)
        else:
            raise AssertionError(f"compute_dtype={bad!r} accepted")
    model = build("mlp", 0).double()
    try:
        FullyShardedDataParallel(model)
    except TypeError as e:
        assert "'0.weight'" in str(e) and "torch.float64" in str(e)
    else:
        raise AssertionError("float64 parameters accepted")
    assert isinstance(model[0].weight, nn.Parameter), "the refused model was modified"


@quiet
def on_a_subgroup():
    """DDP + ZeRO-1 and FSDP on the group of ranks 0 and 1 only; the others sit out."""
    comm = minipar.init()
    group = minipar.new_group([0, 1])
    if comm.rank > 1:
        return
    want = reference("tied", "adamw")
    x, y = batch("tied")
    half = slice(comm.rank * N // 2, (comm.rank + 1) * N // 2)
    model = build("tied", comm.rank)
    ddp = DistributedDataParallel(model, group=group, bucket_cap_mb=0.0004)
    opt = ZeroRedundancyOptimizer(
        ddp.parameters(), torch.optim.AdamW, group=group, lr=0.01, weight_decay=0.1
    )
    fsdp = FullyShardedDataParallel(build("tied", comm.rank), group=group)
    opt2 = optimizer("adamw", fsdp.parameters())
    for step in range(STEPS):
        for m, o in ((ddp, opt), (fsdp, opt2)):
            o.zero_grad()
            loss_of("tied", m(x[half]), y[half]).backward()
            o.step()
        assert_params(dict(model.named_parameters()), want[step], group, f"DDP+ZeRO {step}")
        assert_params(fsdp.gather_full_params(), want[step], group, f"FSDP {step}")


# -- Hybrid sharding (HSDP) on 4 ranks: shard groups {0, 1}, {2, 3} (a node each), replicate
# groups {0, 2}, {1, 3} (the same shard on both nodes) ---------------------------------------


def hybrid_groups():
    """(shard group, replicate group) of this rank; every rank creates all four groups."""
    me = minipar.get_rank()
    shard = [minipar.new_group(r) for r in ([0, 1], [2, 3])][me // 2]
    replicate = [minipar.new_group(r) for r in ([0, 2], [1, 3])][me % 2]
    return shard, replicate


def hybrid_training(kind, opt_name):
    """Each of the 4 ranks trains on its quarter of the batch, sharded over 2 and replicated
    over 2: every step's weights (and the first step's gradients) the one-process run's on the
    full batch (plain torch), and the blocks equal across the replicate group."""

    @quiet
    def case():
        comm = minipar.init()
        shard, replicate = hybrid_groups()
        want = reference(kind, opt_name)
        dense = build(kind, 0)
        x, y = batch(kind)
        loss_of(kind, dense(x), y).backward()
        fsdp = FullyShardedDataParallel(
            build(kind, comm.rank), group=shard, replicate_group=replicate
        )
        opt = optimizer(opt_name, fsdp.parameters())
        for step in range(STEPS):
            opt.zero_grad()
            loss_of(kind, fsdp(local(x, comm)), local(y, comm)).backward()
            if step == 0:
                check_hybrid_grads(fsdp, dense, shard)
            same_on_every_rank([p.grad for p in fsdp.parameters() if p.grad is not None],
                               replicate, "hybrid gradients")  # fmt: skip
            opt.step()
            assert_params(fsdp.gather_full_params(), want[step], comm, f"HSDP {kind} {step}")

    return case


def check_hybrid_grads(fsdp, dense, shard):
    """Each unit's block gradient is its block of the dense model's flat gradient (zeros where
    a parameter has none)."""
    grads = {
        n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in dense.named_parameters()
    }
    for unit in fsdp.units:
        flat = torch.zeros(unit.block * shard.size)
        for offset, shape, _, name in unit.layout:
            flat[offset : offset + shape.numel()] = grads[name].reshape(-1)
        mine = flat[shard.rank * unit.block : (shard.rank + 1) * unit.block]
        if unit.shard.grad is None:  # no parameter of the unit had a gradient
            assert not mine.any(), f"{unit.name}: no gradient, the dense model's {mine}"
        else:
            torch.testing.assert_close(unit.shard.grad, mine, rtol=1e-5, atol=1e-6)


@quiet
def hybrid_ledger():
    """Bytes per group (and per link) for Psi parameter bytes, s = r = 2: inside the shard group the
    all-gathers move 2 (s-1)/s Psi and the reduce-scatter (s-1)/s Psi, as FSDP over s ranks;
    across, ONE all-reduce of the Psi/s gradient block: 2 (r-1)/r Psi/s (the ring's count; any
    all-reduce on 2 ranks sends its buffer once); nothing else on any group."""
    comm = minipar.init()
    shard, replicate = hybrid_groups()
    x, y = batch("mlp")
    x.requires_grad_(True)
    fsdp = FullyShardedDataParallel(build("mlp", 0), group=shard, replicate_group=replicate)
    with minipar.trace() as t:
        loss_of("mlp", fsdp(local(x, comm)), local(y, comm)).backward()
    psi = 4 * sum(p.numel() for p in build("mlp", 0).parameters())
    s = r = 2
    inside = [
        c for c in t.calls if t.groups[c.group] == [2 * (comm.rank // 2), 2 * (comm.rank // 2) + 1]
    ]
    across = [c for c in t.calls if t.groups[c.group] == [comm.rank % 2, comm.rank % 2 + 2]]
    assert len(inside) + len(across) == len(t.calls), [(c.group, c.collective) for c in t.calls]
    sent = lambda calls, what: sum(c.bytes_sent for c in calls if c.collective == what)  # noqa: E731
    assert sent(inside, "all_gather") == 2 * (s - 1) * psi // s
    assert sent(inside, "reduce_scatter") == (s - 1) * psi // s
    assert {c.collective for c in inside} == {"all_gather", "reduce_scatter"}
    assert [c.collective for c in across] == ["all_reduce"], [c.collective for c in across]
    assert sent(across, "all_reduce") == 2 * (r - 1) * psi // (s * r)
    # on 2 nodes of 2 (the cluster's extended run) the shard groups are the nodes: only the
    # all-reduce crosses the link; on one node nothing does
    crossing = sum(c.bytes_between_nodes for c in t.calls)
    assert crossing == (sent(across, "all_reduce") if minipar.num_nodes() == 2 else 0), crossing


@quiet
def hybrid_zero1():
    """ZeRO-1 hybrid: DDP over all 4 ranks (the gradients), the optimizer state sharded over
    the shard group only: SGD steps the one-process run's, and the updated parameters are
    broadcast inside the shard group only (each rank receives Psi minus its own shard's bytes,
    as ZeRO-1 over s ranks), nothing across."""
    comm = minipar.init()
    shard, _ = hybrid_groups()
    want = reference("tied", "sgd")
    x, y = batch("tied")
    model = build("tied", comm.rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.0004)
    cls, kw = ZERO_KINDS["sgd"]
    opt = ZeroRedundancyOptimizer(ddp.parameters(), cls, group=shard, **kw)
    total = sum(4 * p.numel() for p in opt._all)
    own = sum(4 * p.numel() for p, r in zip(opt._all, opt.owner) if r == shard.rank)
    inside = [2 * (comm.rank // 2), 2 * (comm.rank // 2) + 1]
    for step in range(STEPS):
        opt.zero_grad()
        loss_of("tied", ddp(local(x, comm)), local(y, comm)).backward()
        with minipar.trace() as t:
            opt.step()
        assert {tuple(t.groups[c.group]) for c in t.calls} == {tuple(inside)}, t.groups
        assert t.bytes_received("broadcast") == total - own
        assert_params(dict(model.named_parameters()), want[step], comm, f"ZeRO-1 hybrid {step}")


@quiet
def hybrid_bad_groups():
    """A replicate group whose ranks hold different shards is refused, naming the flag."""
    minipar.init()
    shard, _ = hybrid_groups()
    wrong = minipar.new_group([0, 1, 2, 3])  # shards 0, 1, 0, 1
    try:
        FullyShardedDataParallel(build("mlp", 0), group=shard, replicate_group=wrong)
    except ValueError as e:
        assert "replicate_group" in str(e) and "[0, 1, 0, 1]" in str(e), e
    else:
        raise AssertionError("a replicate group mixing shards accepted")


@quiet
def hybrid_uneven_shards():
    """3 ranks: shard groups {0, 1} and {2}, replicate group {0, 2} (shards of 2 and of 1 rank):
    refused on both of its ranks, naming the sizes, before any collective on a shard group
    (rank 1 takes no part: it would wait on rank 0 otherwise)."""
    me = minipar.init().rank
    shard = [minipar.new_group(r) for r in ([0, 1], [2])][me // 2]
    replicate = minipar.new_group([0, 2])
    if me == 1:
        return
    try:
        FullyShardedDataParallel(build("mlp", 0), group=shard, replicate_group=replicate)
    except ValueError as e:
        assert "differ in size [2, 1]" in str(e), e
    else:
        raise AssertionError("shard groups of 2 and 1 ranks accepted for hybrid sharding")


def cases(size):
    table = {}
    for kind in ("mlp", "tied"):
        for opt_name in ("sgd", "adamw"):
            table[f"ddp_{kind}_{opt_name}"] = ddp_training(kind, opt_name)
            table[f"fsdp_{kind}_{opt_name}"] = fsdp_training(kind, opt_name)
    table.update(
        ddp_no_sync=ddp_no_sync,
        ddp_unused_on_some_ranks=ddp_unused_on_some_ranks,
        ddp_explicit_finish_idempotent=ddp_explicit_finish_idempotent,
        ddp_ledger=ddp_ledger,
        ddp_skips_expert_parameters=ddp_skips_expert_parameters,
        ddp_bad_inputs=ddp_bad_inputs,
        zero_alone_bitwise=zero_alone_bitwise,
        zero_memory_and_state_dict=zero_memory_and_state_dict,
        zero_with_ddp=zero_with_ddp,
        zero_bad_class=zero_bad_class,
        fsdp_mlp_units_linear=fsdp_training("mlp", "adamw", shard_modules=(nn.Linear,)),
        fsdp_tied_units_linear=fsdp_training("tied", "adamw", shard_modules=(nn.Linear,)),
        fsdp_tied_bf16=fsdp_training("tied", "sgd", torch.bfloat16),
        fsdp_mlp_fp16=fsdp_training("mlp", "sgd", torch.float16),
        fsdp_ledger=fsdp_ledger,
        fsdp_bad_inputs=fsdp_bad_inputs,
        auto_reductions_by_node=auto_reductions_by_node,
    )
    if size > 2:
        table["on_a_subgroup"] = on_a_subgroup
    if size == 3:
        table["hybrid_uneven_shards"] = hybrid_uneven_shards
    if size == 4:
        table.update(
            zero_on_offset_groups=zero_on_offset_groups,
            ddp_fsdp_on_offset_groups=ddp_fsdp_on_offset_groups,
            hybrid_mlp_adamw=hybrid_training("mlp", "adamw"),
            hybrid_tied_sgd=hybrid_training("tied", "sgd"),
            hybrid_ledger=hybrid_ledger,
            hybrid_zero1=hybrid_zero1,
            hybrid_bad_groups=hybrid_bad_groups,
        )
    if size > 1:
        table.update(ddp_vs_torch_ddp=ddp_vs_torch_ddp, zero_vs_torch_zero=zero_vs_torch_zero)
        table["ddp_across_nodes_takes_two_levels"] = ddp_across_nodes_takes_two_levels
    return table
