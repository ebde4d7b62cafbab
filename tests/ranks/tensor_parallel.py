"""Tensor-parallel layers on real ranks, each against its dense single-device twin.

Every rank builds the same dense module and inputs (same seed), the parallel layer takes its
slice with `from_dense`, and both run forward and backward with the same upstream gradient:
outputs, input gradients and every parameter gradient must match this rank's slice of the dense
ones. Also: the vocabulary-parallel loss on logits of magnitude 100-1000 (where exp overflows
without the global max subtracted) in float32, float16 and bfloat16 against F.cross_entropy,
a transformer block (norms, attention, MLP, residuals), the communication each layer
makes (trace ledger against minipar.cost's formulas), torch.distributed.tensor.parallel on the
same weights (the MLP with and without sequence parallelism and the attention, at TP = 2; gloo
brought up beside MPI in the same job), two TP groups side by side (4 ranks), and layouts that
cannot split.

Tolerance: float32, within 1e-5 of the expected tensor's largest magnitude. The parallel layers
compute the same products but add them in a different grouping (p partial sums of in/p terms,
then the all-reduce adds the p partials in its own order); each float32 sum of k terms may then
differ by about k * 2^-24 of the terms' magnitude, under 3e-6 for the k <= 48 here.
"""

import copy
import functools

import torch
from torch import nn
from torch.nn import functional as F

import minipar
from minipar.parallel import recompute
from minipar.parallel.tensor import (
    ColumnParallelLinear,
    DenseMLP,
    DenseSelfAttention,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelHead,
    mark_sequence_parallel,
    scatter_to_sequence_parallel_region,
    sync_sequence_parallel_grads,
    vocab_parallel_cross_entropy,
)

RTOL = 1e-5
H, HEADS, FFN, VOCAB, B, S = 24, 12, 48, 48, 2, 12  # every size divides by 1, 2, 3 and 4


def close(actual, expected, what):
    """|actual - expected| <= RTOL * max|expected|, elementwise (torch.testing costs seconds to
    import in every rank)."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    scale = expected.abs().max().item() or 1.0
    err = (actual.detach() - expected.detach()).abs().max().item() if actual.numel() else 0.0
    assert err <= RTOL * scale, f"{what}: max error {err:.3g} > {RTOL} x {scale:.3g}"


def me(group=None):
    return minipar.get_rank(group), minipar.get_world_size(group)


def piece(t, dim, group=None):
    """This rank's contiguous slice of t along dim."""
    r, p = me(group)
    return t.chunk(p, dim=dim)[r]


def seq(t, group=None):
    return piece(t, 1, group)


def full(t):
    return t


# -- the twins, run side by side ---------------------------------------------------------------
def run_twins(dense, parallel, x, in_view, out_view, group=None, sp=False):
    """Forward and backward through both with the same upstream gradient; check the output and
    the input's gradient (this rank's views of the dense ones); return nothing: the caller
    checks the parameters' gradients."""
    xd = x.clone().requires_grad_()
    yd = dense(xd)
    dy = torch.randn_like(yd)  # same seed everywhere: the same upstream gradient on every rank
    (yd * dy).sum().backward()
    xp = in_view(x).clone().requires_grad_()
    yp = parallel(xp)
    (yp * out_view(dy)).sum().backward()
    if sp:
        sync_sequence_parallel_grads(parallel, group)
    close(yp, out_view(yd), "output")
    close(xp.grad, in_view(xd.grad), "input gradient")


def grads_twin(dense):
    """A copy of the dense module whose parameters hold its gradients, so that the parallel
    class's from_dense slices the gradients exactly as it sliced the weights."""
    twin = copy.deepcopy(dense)
    with torch.no_grad():
        for q, qd in zip(twin.parameters(), dense.parameters()):
            q.copy_(qd.grad)
    return twin


def check_param_grads(parallel, expected):
    got, want = dict(parallel.named_parameters()), dict(expected.named_parameters())
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for name, q in got.items():
        assert q.grad is not None, f"{name} got no gradient"
        close(q.grad, want[name].detach(), f"gradient of {name}")


def inputs():
    torch.manual_seed(1234)
    return torch.randn(B, S, H)


# -- column and row layers, checked against explicit slices -----------------------------------
def column_case(bias, sp, gather_output):
    def case():
        r, p = me()
        x = inputs()
        dense = nn.Linear(H, FFN, bias=bias)
        layer = ColumnParallelLinear.from_dense(
            dense, gather_output=gather_output, sequence_parallel=sp
        )
        assert layer.weight.shape == (FFN // p, H)
        out_view = full if gather_output else (lambda t: piece(t, -1))
        run_twins(dense, layer, x, seq if sp else full, out_view, sp=sp)
        rows = slice(r * FFN // p, (r + 1) * FFN // p)
        close(layer.weight.grad, dense.weight.grad[rows], "weight gradient")
        if bias:
            close(layer.bias.grad, dense.bias.grad[rows], "bias gradient")

    return case


def row_case(bias, sp, input_is_parallel):
    def case():
        r, p = me()
        x = torch.randn(B, S, FFN, generator=torch.Generator().manual_seed(5))
        torch.manual_seed(6)
        dense = nn.Linear(FFN, H, bias=bias)
        layer = RowParallelLinear.from_dense(
            dense, input_is_parallel=input_is_parallel, sequence_parallel=sp
        )
        assert layer.weight.shape == (H, FFN // p)
        in_view = (lambda t: piece(t, -1)) if input_is_parallel else full
        run_twins(dense, layer, x, in_view, seq if sp else full, sp=sp)
        cols = slice(r * FFN // p, (r + 1) * FFN // p)
        close(layer.weight.grad, dense.weight.grad[:, cols], "weight gradient")
        if bias:
            close(layer.bias.grad, dense.bias.grad, "bias gradient (full, added once)")

    return case


# -- MLP, attention, a transformer block ------------------------------------------------------
class DenseBlock(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(.))."""

    def __init__(self, bias=True):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(H), DenseSelfAttention(H, HEADS, bias)
        self.ln2, self.mlp = nn.LayerNorm(H), DenseMLP(H, FFN, bias)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ParallelBlock(DenseBlock):
    """The same block with the attention and MLP split; with sequence parallelism the norms and
    residuals run on this rank's slice of the sequence (their parameters marked for the sum)."""

    @classmethod
    def from_dense(cls, dense, group=None, sequence_parallel=False):
        block = copy.deepcopy(dense)
        block.__class__ = cls
        block.attn = ParallelSelfAttention.from_dense(dense.attn, group, sequence_parallel)
        block.mlp = ParallelMLP.from_dense(dense.mlp, group, sequence_parallel)
        if sequence_parallel:
            mark_sequence_parallel(block.ln1), mark_sequence_parallel(block.ln2)
        return block


def twin_case(kind, bias, sp):
    build = {
        "mlp": (lambda: DenseMLP(H, FFN, bias), ParallelMLP),
        "attention": (lambda: DenseSelfAttention(H, HEADS, bias), ParallelSelfAttention),
        "block": (lambda: DenseBlock(bias), ParallelBlock),
    }[kind]

    def case():
        x = inputs()
        dense = build[0]()
        parallel = build[1].from_dense(dense, sequence_parallel=sp)
        run_twins(dense, parallel, x, seq if sp else full, seq if sp else full, sp=sp)
        check_param_grads(parallel, build[1].from_dense(grads_twin(dense), sequence_parallel=sp))

    return case


def recompute_case(sp):
    """A tensor-parallel block (with sequence parallelism or not) under full and selective
    recomputation: the output and every gradient bitwise those of the run without it (the same
    kernels in the same order); full recomputation runs the block's collectives again in
    backward (each forward all-reduce or all-gather once more), selective none."""

    def case():
        x, runs = inputs(), {}
        for policy in recompute.POLICIES:
            torch.manual_seed(11)
            block = ParallelBlock.from_dense(DenseBlock(), sequence_parallel=sp)
            recompute.apply(block, policy, blocks=(ParallelBlock,))
            xp = (seq if sp else full)(x).clone().requires_grad_()
            with minipar.trace() as t:
                y = block(xp)
                forward_calls = len(t.calls)
                (y * y).sum().backward()
            if sp:
                sync_sequence_parallel_grads(block)
            grads = [q.grad.clone() for q in block.parameters()] + [xp.grad]
            runs[policy] = (y.detach(), grads, forward_calls, len(t.calls))
        y0, g0, forward, total = runs["none"]
        for policy, (y, grads, f, n) in runs.items():
            assert torch.equal(y, y0), (policy, sp, "output")
            assert all(torch.equal(a, b) for a, b in zip(grads, g0)), (policy, sp, "gradients")
            extra = forward if policy == "full" else 0  # the forward's collectives, again
            assert (f, n) == (forward, total + extra), (policy, sp, f, n, forward, total)

    return case


def subgroups():
    """Two tensor-parallel groups side by side ({0, 1} and {2, 3}): layers use only their own;
    the embedding and the loss take the vocabulary slice of their group rank."""
    w = minipar.init()
    groups = [minipar.new_group([0, 1]), minipar.new_group([2, 3])]
    group = groups[w.rank // 2]
    x = inputs() + w.rank // 2  # the two groups work on different data
    dense = DenseBlock()
    for sp in (False, True):
        parallel = ParallelBlock.from_dense(dense, group, sequence_parallel=sp)
        dense.zero_grad()
        view = (lambda t: seq(t, group)) if sp else full
        with minipar.trace() as t:
            run_twins(dense, parallel, x, view, view, group=group, sp=sp)
        assert {c.group for c in t.calls} == {group.name}, {c.group for c in t.calls}
        check_param_grads(parallel, ParallelBlock.from_dense(grads_twin(dense), group, sp))
    # the vocabulary slices follow the group's rank, not the world's
    embedding(group)
    cross_entropy_large_case(torch.float32, group)()


def dense_dtype_case():
    """from_dense keeps the dense model's dtype and device (float64 here; a GPU's in
    cuda_strategies): every shard of every layer is a float64 copy of its slice, and the
    float64 forward matches the dense one to float64 precision."""
    torch.manual_seed(5)
    x = inputs().double()
    ids = torch.randint(0, VOCAB, (B, S))
    pairs = [
        (nn.Linear(H, FFN).double(), ColumnParallelLinear, {"gather_output": True}),
        (nn.Linear(H, VOCAB).double(), VocabParallelHead, {"gather_output": True}),
        (DenseBlock().double(), ParallelBlock, {}),
        (nn.Embedding(VOCAB, H).double(), VocabParallelEmbedding, {}),
    ]
    for dense, cls, kwargs in pairs:
        layer = cls.from_dense(dense, **kwargs)
        for name, q in layer.named_parameters():
            assert q.dtype == torch.float64, f"{cls.__name__}.{name}: {q.dtype}, not float64"
        arg = ids if cls is VocabParallelEmbedding else x
        y, want = layer(arg), dense(arg)
        err = (y - want).abs().max().item()
        assert y.dtype == torch.float64 and err < 1e-12, (cls.__name__, y.dtype, err)


# -- embedding and cross-entropy --------------------------------------------------------------
def embedding(group=None):
    r, p = me(group)
    torch.manual_seed(7)
    dense = nn.Embedding(VOCAB, H)
    ids = torch.randint(0, VOCAB, (B, S))
    layer = VocabParallelEmbedding.from_dense(dense, group)
    assert layer.weight.shape == (VOCAB // p, H)
    yd, yp = dense(ids), layer(ids)
    dy = torch.randn_like(yd)
    (yd * dy).sum().backward()
    (yp * dy).sum().backward()
    close(yp, yd, "embedding output")
    rows = slice(r * VOCAB // p, (r + 1) * VOCAB // p)
    close(layer.weight.grad, dense.weight.grad[rows], "embedding gradient")


def cross_entropy_case(reduction):
    def case():
        r, p = me()
        torch.manual_seed(8)
        logits = (3 * torch.randn(B, S, VOCAB)).requires_grad_()
        target = torch.randint(0, VOCAB, (B, S))
        target[0, :p] = torch.arange(p) * (VOCAB // p)  # targets on every rank's first row
        want = F.cross_entropy(logits.view(-1, VOCAB), target.view(-1), reduction=reduction)
        dl = torch.randn_like(want)
        (want * dl).sum().backward()
        mine = piece(logits.detach(), -1).clone().requires_grad_()
        with minipar.trace() as t:
            got = vocab_parallel_cross_entropy(mine, target, reduction=reduction)
        (got * dl.view_as(got)).sum().backward()
        close(got.view_as(want), want, "loss")
        close(mine.grad, piece(logits.grad, -1), "logits gradient")
        # never gathers the logits: one all-reduce of the max, one of (sum-exp, target logit)
        assert all(c.collective == "all_reduce" for c in t.calls), t.algorithms
        assert len(t.calls) == (2 if p > 1 else 0)
        check_traffic(t.calls, [("all_reduce", B * S * 4), ("all_reduce", 2 * B * S * 4)], p)

    return case


def cross_entropy_large_case(dtype, group=None):
    """Logits of magnitude 100 to 1000 (exp overflows float32 past 88: only a max subtracted,
    the same global one on every rank, keeps the sum finite and exact), given in `dtype`: loss
    and logits gradient against F.cross_entropy of the same numbers in float32. The loss is
    float32 on both sides (rtol RTOL); the gradient comes back in `dtype`, within one rounding
    of it (float32: RTOL)."""

    def case():
        r, p = me(group)
        torch.manual_seed(9)
        scale = torch.logspace(2, 3, B * S).view(B, S, 1)  # 100 .. 1000, one per token
        logits = (scale * torch.randn(B, S, VOCAB)).to(dtype)
        target = torch.randint(0, VOCAB, (B, S))
        target[0, :p] = torch.arange(p) * (VOCAB // p)  # targets on every rank's first row
        full32 = logits.detach().float().clone().requires_grad_()
        want = F.cross_entropy(full32.view(-1, VOCAB), target.view(-1), reduction="none")
        dl = torch.rand_like(want)
        (want * dl).sum().backward()
        mine = piece(logits, -1, group).clone().requires_grad_()
        got = vocab_parallel_cross_entropy(mine, target, group, reduction="none")
        (got * dl.view_as(got)).sum().backward()
        bad = int((~torch.isfinite(got)).sum())
        assert not bad, f"{dtype}: {bad} of {got.numel()} losses inf or nan"
        close(got.float().view_as(want), want, f"{dtype} loss")
        assert got.dtype == torch.float32, f"{dtype} logits: the loss is {got.dtype}"
        assert mine.grad.dtype == dtype, mine.grad.dtype
        expected = piece(full32.grad, -1, group)
        err = (mine.grad.float() - expected).abs().max().item()
        tol = RTOL if dtype == torch.float32 else torch.finfo(dtype).eps
        assert err <= tol * expected.abs().max().item(), f"{dtype} gradient: max error {err:.3g}"

    return case


# -- communication from the trace ledger -------------------------------------------------------
def check_traffic(calls, expected, p):
    """Each call is the expected (collective, payload bytes): its bytes sent as minipar.cost's
    formula for the algorithm it ran (where the formula is exact for this p)."""
    if p == 1:
        assert not calls, [c.collective for c in calls]
        return
    assert [c.collective for c in calls] == [c for c, _ in expected], [c.collective for c in calls]
    for call, (collective, nbytes) in zip(calls, expected):
        want = minipar.cost.traffic(collective, call.algorithm, nbytes, p)
        if want.exact:
            assert call.bytes_sent == want.bytes_sent, (collective, call.algorithm, nbytes)


def ledger_case(sp):
    """Per transformer layer: two all-reduces of b*s*h elements forward and two backward
    (Megatron); with sequence parallelism an all-gather and a reduce-scatter in place of each,
    the same bytes on the ring, and the norms' activations 1/p the size."""

    def case():
        _, p = me()
        x = inputs()
        parallel = ParallelBlock.from_dense(DenseBlock(), sequence_parallel=sp)
        seen = []
        for ln in (parallel.ln1, parallel.ln2):
            ln.register_forward_pre_hook(lambda m, a: seen.append(a[0].numel()))
        xp = (seq(x) if sp else x).clone().requires_grad_()
        with minipar.trace() as fwd:
            y = parallel(xp)
        with minipar.trace() as bwd:
            y.sum().backward()
        n = B * S * H * 4  # bytes of one (b, s, h) float32 activation
        if sp:
            pair = [("all_gather", n), ("reduce_scatter", n)]
            assert seen == [B * S * H // p] * 2, seen
        else:
            pair = [("all_reduce", n)]
            assert seen == [B * S * H] * 2, seen
        check_traffic(fwd.calls, pair * 2, p)
        check_traffic(bwd.calls, pair * 2, p)  # backward: f's all-reduces (SP: reversed pairs)
        ring = functools.partial(minipar.cost.traffic, algorithm="ring", nbytes=n, p=max(p, 2))
        halves = ring("all_gather").bytes_sent + ring("reduce_scatter").bytes_sent
        assert halves == ring("all_reduce").bytes_sent  # the same volume, in two halves

    return case


# -- against torch.distributed.tensor.parallel ------------------------------------------------
@functools.cache
def torch_mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        from mpi4py import MPI

        from minipar.comm.transport.torch import init_from_mpi

        init_from_mpi(MPI.COMM_WORLD)
    return init_device_mesh("cpu", (dist.get_world_size(),))


def against_torch(sp):
    """ParallelMLP against torch's ColwiseParallel/RowwiseParallel on the same weights (torch's
    sequence-parallel styles shard dimension 1 of (batch, seq, hidden), as minipar does)."""

    def case():
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        x = inputs()
        dense = DenseMLP(H, FFN)
        ours = ParallelMLP.from_dense(dense, sequence_parallel=sp)
        plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        if sp:
            plan = {
                "fc1": ColwiseParallel(input_layouts=Shard(1)),
                "fc2": RowwiseParallel(output_layouts=Shard(1)),
            }
        theirs = parallelize_module(copy.deepcopy(dense), torch_mesh(), plan)
        view = seq if sp else full
        outs = []
        for module in (ours, theirs):
            xp = view(x).clone().requires_grad_()
            y = module(xp)
            (y * view(torch.ones_like(x)).cumsum(1)).sum().backward()
            outs.append((y, xp.grad))
        sync_sequence_parallel_grads(ours)
        close(outs[0][0], outs[1][0].detach(), "output vs torch")
        close(outs[0][1], outs[1][1], "input gradient vs torch")
        for (name, q), (_, tq) in zip(ours.named_parameters(), theirs.named_parameters()):
            theirs_grad = tq.grad.full_tensor() if name == "fc2.bias" else tq.grad.to_local()
            close(q.grad, theirs_grad, f"gradient of {name} vs torch")

    return case


def attention_against_torch():
    """ParallelSelfAttention against torch's ColwiseParallel(qkv)/RowwiseParallel(proj), built as
    `minipar bench tp` builds it (torch's copy has qkv's rows ordered by rank, its heads local)."""
    from minipar.bench import tp

    ours, theirs, x = tp.build("attention", torch_mesh(), shape=(B, S, H, FFN, HEADS))
    outs = []
    for module in (ours, theirs):
        xp = x.clone().requires_grad_()
        y = module(xp)
        (y * torch.ones_like(x).cumsum(1)).sum().backward()
        outs.append((y, xp.grad))
    close(outs[0][0], outs[1][0].detach(), "output vs torch")
    close(outs[0][1], outs[1][1], "input gradient vs torch")
    for (name, q), (_, tq) in zip(ours.named_parameters(), theirs.named_parameters()):
        theirs_grad = tq.grad.full_tensor() if name == "proj.bias" else tq.grad.to_local()
        close(q.grad, theirs_grad, f"gradient of {name} vs torch")


# -- layouts that cannot split -----------------------------------------------------------------
def bad_layouts():
    """ValueError naming the dimension, its size and the group size, before any message (a
    vocabulary does not divide either: it is padded, tests/ranks/vocab_padding.py)."""
    _, p = me()
    odd = 2 * 3 * 4 + 1  # divides by none of 2, 3, 4
    attempts = [
        (lambda: ColumnParallelLinear(H, odd), f"out_features has size {odd}"),
        (lambda: RowParallelLinear(odd, H), f"in_features has size {odd}"),
        (lambda: ParallelSelfAttention(odd, odd), f"num_heads has size {odd}"),
        (lambda: ParallelMLP(H, odd), f"out_features has size {odd}"),
        (
            lambda: scatter_to_sequence_parallel_region(torch.randn(B, odd, H)),
            f"dimension 1 of the input has size {odd}",
        ),
    ]
    with minipar.trace() as t:
        for make, words in attempts:
            try:
                make()
            except ValueError as e:
                assert words in str(e) and f"group size {p}" in str(e), str(e)
            else:
                raise AssertionError(f"no ValueError for {words!r} on {p} ranks")
    assert not t.messages, "bad layouts must raise before any byte moves"


def cases(size):
    table = {}
    for bias in (True, False):
        b = "bias" if bias else "nobias"
        for sp in (False, True):
            s = "sp" if sp else "tp"
            table[f"column.{b}.{s}"] = column_case(bias, sp, False)
            table[f"row.{b}.{s}"] = row_case(bias, sp, True)
            for kind in ("mlp", "attention", "block"):
                table[f"{kind}.{b}.{s}"] = twin_case(kind, bias, sp)
        table[f"column.{b}.gather_output"] = column_case(bias, False, True)
        table[f"row.{b}.input_not_parallel"] = row_case(bias, False, False)
    table["embedding"] = embedding
    table["from_dense.float64"] = dense_dtype_case
    for reduction in ("mean", "sum", "none"):
        table[f"cross_entropy.{reduction}"] = cross_entropy_case(reduction)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        table[f"cross_entropy.large.{str(dtype)[6:]}"] = cross_entropy_large_case(dtype)
    table["ledger.tp"] = ledger_case(False)
    table["ledger.sp"] = ledger_case(True)
    table["recompute.tp"] = recompute_case(False)
    table["recompute.sp"] = recompute_case(True)
    if size > 1:
        table["bad_layouts"] = bad_layouts
    if size == 4:
        table["subgroups"] = subgroups
    if size == 2:  # gloo comes up beside MPI in the same job
        table["vs_torch.tp"] = against_torch(False)
        table["vs_torch.sp"] = against_torch(True)
        table["vs_torch.attention"] = attention_against_torch
    return table
