"""A vocabulary the tensor-parallel group does not divide, padded Megatron's way (plan.py's
vocab cut), on real ranks at TP = 1, 2 and 4 (tests/test_vocab_padding.py).

- embedding.* / head.* / cross_entropy.*: each layer against its dense twin (nn.Embedding,
  nn.Linear, F.cross_entropy) for V = 67 padded to a multiple of 1, 8 or 128 x tp: outputs,
  loss and gradients equal the dense ones; padded rows are zero, get exactly zero gradient,
  their logits are -inf and never win an argmax, even where every real logit is negative;
- inert.*: the layers built directly (no from_dense to load zeros): padded rows zero from the
  start, the loss over the V real classes alone, no gradient, still zero after an AdamW step
  (and train.*: still zero after training on the mesh);
- gpt.*: the tiny GPT with V = 67, 251 (tied) and GPT-2's 50,257 built on a mesh of tp = the
  world (build_chunks): loss and every parameter's gradient equal the dense model's (each
  dense gradient cut by sharding.shard, padding included, so the padded rows must be zero),
  the padded size stated (attribute and repr), the dense state gathered back bit for bit;
- train.* / resume: V = 257 (GPT-2's tokens would not fit the shipped byte data; 257 is
  prime) trained on meshes against the dense run, and a run moved from tp = 4 to dp 2 x tp 2
  with its AdamW state (the re-cut of a padded vocabulary);
- bad.*: a bad vocab_multiple or vocab_size, the same ValueError on every rank, no message.

Tolerance: float32 within RTOL of the expected tensor's largest magnitude (the sums run in
another order); losses within LOSS_RTOL.
"""

import torch
from torch import nn
from torch.nn import functional as F

import minipar
from minipar.models import GPTConfig, build_gpt, lm_loss, sharding, training
from minipar.models.config import RunSpec
from minipar.models.gpt import GPT
from minipar.models.parallel_gpt import build_chunks
from minipar.parallel import DeviceMesh
from minipar.parallel.tensor import (
    VocabParallelEmbedding,
    VocabParallelHead,
    padded_vocab,
    vocab_parallel_cross_entropy,
)

RTOL, LOSS_RTOL = 1e-5, 1e-5
V, H, B, S = 67, 16, 2, 6


def close(actual, expected, what, rtol=RTOL):
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if not expected.numel():  # a rank whose slice is all padding
        return
    scale = expected.abs().max().item() or 1.0
    err = (actual.detach() - expected.detach()).abs().max().item()
    assert err <= rtol * scale, f"{what}: max error {err:.3g} > {rtol} x {scale:.3g}"


def me(group=None):
    return minipar.get_rank(group), minipar.get_world_size(group)


def all_logits(local, group=None):
    """Every rank's logits slice, padding included, side by side: (..., Vp)."""
    _, p = me(group)
    if p == 1:
        return local.detach().clone()
    front = local.detach().movedim(-1, 0).contiguous()
    out = front.new_empty((p * front.shape[0], *front.shape[1:]))
    minipar.all_gather_into_tensor(out, front, group=group)
    return out.movedim(0, -1)


def check_padded_rows(weight, grad, real: int, what: str):
    assert (weight[real:] == 0).all(), f"{what}: padded rows are not zero"
    assert grad is None or (grad[real:] == 0).all(), f"{what}: padded rows got a gradient"


# -- the layers ------------------------------------------------------------------------------
def embedding_case(multiple):
    def case():
        r, p = me()
        torch.manual_seed(1)
        dense = nn.Embedding(V, H)
        ids = torch.randint(0, V, (B, S))
        ids[0, :] = V - 1  # the last real row, next to the padding
        layer = VocabParallelEmbedding.from_dense(dense, vocab_multiple=multiple)
        padded = padded_vocab(V, p, multiple)
        assert layer.padded_vocab_size == padded and padded % (multiple * p) == 0
        assert padded - multiple * p < V <= padded, (V, padded)
        assert f"padded_vocab_size={padded}" in repr(layer), repr(layer)
        assert layer.weight.shape == (padded // p, H)
        yd, yp = dense(ids), layer(ids)
        dy = torch.randn_like(yd)
        (yd * dy).sum().backward()
        (yp * dy).sum().backward()
        close(yp, yd, "embedding output")
        rows = padded // p
        expected = torch.cat([dense.weight.grad, torch.zeros(padded - V, H)])[r * rows :][:rows]
        close(layer.weight.grad, expected, "embedding gradient")
        check_padded_rows(layer.weight, layer.weight.grad, layer.real_rows, "embedding")

    return case


def head_case(multiple, bias):
    """Real logits all near -10 (the bias): an unmasked padded logit (0) would win every
    argmax. Gathered logits, the loss and the gradients equal the dense layer's."""

    def case():
        r, p = me()
        torch.manual_seed(2)
        dense = nn.Linear(H, V, bias=bias)
        with torch.no_grad():
            dense.weight.mul_(0.01)
            if bias:
                dense.bias.fill_(-10.0)
        x = torch.randn(B, S, H)
        target = torch.randint(0, V, (B, S))
        target[0, 0] = V - 1
        head = VocabParallelHead.from_dense(dense, vocab_multiple=multiple)
        padded = padded_vocab(V, p, multiple)
        assert head.padded_vocab_size == padded and head.vocab_size == V == head.out_features
        assert f"padded_vocab_size={padded}" in repr(head), repr(head)
        xd, xp = x.clone().requires_grad_(), x.clone().requires_grad_()
        want = F.cross_entropy(dense(xd).view(-1, V), target.view(-1))
        want.backward()
        local = head(xp)
        assert local.shape == (B, S, padded // p)
        assert (local[..., head.real_rows :] == float("-inf")).all(), "padded logits not -inf"
        everything = all_logits(local)
        assert (everything.argmax(-1) < V).all(), "a padded logit won the argmax"
        close(everything[..., :V], dense(x), "logits")
        got = vocab_parallel_cross_entropy(local, target)
        got.backward()
        close(got, want, "loss", LOSS_RTOL)
        close(xp.grad, xd.grad, "input gradient")
        rows = padded // p
        for name in ("weight", "bias") if bias else ("weight",):
            g = getattr(dense, name).grad
            expected = torch.cat([g, g.new_zeros(padded - V, *g.shape[1:])])[r * rows :][:rows]
            close(getattr(head, name).grad, expected, f"head {name} gradient")
            check_padded_rows(getattr(head, name), getattr(head, name).grad, head.real_rows, name)
        gathered = VocabParallelHead.from_dense(dense, gather_output=True, vocab_multiple=multiple)
        close(gathered(x), dense(x), "gather_output logits")

    return case


def cross_entropy_vocab_size():
    """Logits with padding that no head masked (large values there): vocab_size=V leaves it
    out of the loss and gives it zero gradient."""
    r, p = me()
    torch.manual_seed(3)
    padded = padded_vocab(V, p, 8)
    logits = torch.randn(B, S, V) * 3
    target = torch.randint(0, V, (B, S))
    want = F.cross_entropy(logits.view(-1, V), target.view(-1), reduction="sum")
    full = torch.cat([logits, torch.full((B, S, padded - V), 50.0)], dim=-1)
    rows = padded // p
    mine = full[..., r * rows : (r + 1) * rows].clone().requires_grad_()
    got = vocab_parallel_cross_entropy(mine, target, reduction="sum", vocab_size=V)
    got.backward()
    close(got, want, "loss", LOSS_RTOL)
    real = max(0, min(rows, V - r * rows))
    assert (mine.grad[..., real:] == 0).all(), "padding got a gradient"
    dense_logits = logits.clone().requires_grad_()
    F.cross_entropy(dense_logits.view(-1, V), target.view(-1), reduction="sum").backward()
    close(mine.grad[..., :real], dense_logits.grad[..., r * rows : r * rows + real], "grad")


def inert_padding(multiple):
    """Layers built directly, not from a dense one (from_dense loads zero padding whatever the
    constructor left): the padded rows start at zero (weight and bias); an embedding and head
    forward and backward: the padded logits are -inf, the loss is the log-softmax over the V
    real columns alone (computed here in float64 from the gathered logits), the padded rows
    get exactly zero gradient and stay exactly zero after an AdamW step with weight decay."""

    def case():
        torch.manual_seed(4)
        emb = VocabParallelEmbedding(V, H, vocab_multiple=multiple)
        head = VocabParallelHead(H, V, bias=True, vocab_multiple=multiple)
        rows = [(emb.weight, emb.real_rows, "embedding"), (head.weight, head.real_rows, "head"),
                (head.bias, head.real_rows, "head bias")]  # fmt: skip
        for q, real, what in rows:
            check_padded_rows(q, None, real, f"{what} as constructed")
        ids, target = torch.randint(0, V, (2, B, S))
        logits = head(emb(ids))
        loss = vocab_parallel_cross_entropy(logits, target)
        loss.backward()
        everything = all_logits(logits)
        assert (everything[..., V:] == float("-inf")).all(), "a padded logit is not -inf"
        real = everything[..., :V].double()
        picked = real.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        close(loss.double(), (real.logsumexp(-1) - picked).mean(), "loss over V classes", LOSS_RTOL)
        opt = torch.optim.AdamW([emb.weight, head.weight, head.bias], lr=0.1, weight_decay=0.1)
        opt.step()
        for q, real, what in rows:
            check_padded_rows(q, q.grad, real, f"{what} after a step")

    return case


# -- the GPT -----------------------------------------------------------------------------------
def gpt_case(vocab, tied=False):
    def case():
        minipar.init()
        mesh = DeviceMesh(1, minipar.get_world_size(), 1)
        tp, r = mesh.tp, mesh.tp_rank
        config = GPTConfig(vocab, seq_len=8, hidden=32, n_layers=2, n_heads=4, tied_head=tied)
        dense = build_gpt(config, seed=5)
        chunk = build_chunks(dense, mesh)[0]
        padded = padded_vocab(vocab, tp, sharding.VOCAB_MULTIPLE)
        for layer in (chunk.embed.tok, chunk.head.proj):
            assert layer.padded_vocab_size == padded, (layer, padded)
        assert f"padded_vocab_size={padded}" in repr(chunk)
        assert (chunk.head.proj.weight is chunk.embed.tok.weight) == tied
        g = torch.Generator().manual_seed(6)
        tokens, targets = torch.randint(0, vocab, (2, 2, 8), generator=g)
        want = lm_loss(dense(tokens), targets)
        want.backward()
        logits = chunk(tokens)
        got = vocab_parallel_cross_entropy(logits, targets, group=mesh.tp_group)
        got.backward()
        close(got, want, "loss", LOSS_RTOL)
        everything = all_logits(logits, mesh.tp_group)
        assert (everything.argmax(-1) < vocab).all(), "a padded logit won the argmax"
        assert (everything[..., vocab:] == float("-inf")).all(), "padded logits not -inf"
        grads = {name: q.grad for name, q in dense.named_parameters()}
        for name, q in chunk.named_parameters():
            expected = sharding.shard(name, grads[name], r, tp)  # zero rows where padded
            close(q.grad, expected, f"gradient of {name}")
        real = chunk.embed.tok.real_rows
        for name in ("embed.tok.weight", "head.proj.weight"):
            q = dict(chunk.named_parameters()).get(name)
            if q is not None:
                check_padded_rows(q, q.grad, real, name)
        pieces = {name: q.detach() for name, q in chunk.named_parameters()}
        state = sharding.gather_dense(pieces, mesh, config)
        for name, ref in dense.state_dict().items():
            if name in state:
                assert torch.equal(state[name], ref), f"{name} gathered back differs"
        for name, q in chunk.named_parameters():  # the re-cut of the dense state: bit for bit
            assert torch.equal(sharding.shard(name, state[name], r, tp), q.detach()), name

    return case


MODEL = GPTConfig(257, seq_len=8, hidden=32, n_layers=2, n_heads=4)


def spec_for(dp, tp, steps=2, model=MODEL):
    return RunSpec(dp, tp, 1, steps=steps, batch_size=4, model=model)


def train_case(dp, tp):
    """V = 257 trained 2 steps on dp x tp (every rank of the world): the dense run's losses and
    final weights (the dense state gathered back, padding dropped)."""

    def case():
        minipar.init()
        spec = spec_for(dp, tp)
        mesh = DeviceMesh(dp, tp, 1)
        losses, part, _ = training.train_on_mesh(spec, mesh)
        state = training.dense_state(part, mesh)
        assert state["embed.tok.weight"].shape == (257, 32)
        ref_losses, dense, _ = training.train_dense(spec)
        problems = training.compare(losses, ref_losses, state, dense.state_dict())
        assert not problems, problems
        vocab = [
            m
            for c in part.chunks
            for m in c.modules()
            if isinstance(m, VocabParallelEmbedding | VocabParallelHead)
        ]
        assert vocab, "no vocabulary-parallel layer found"
        for m in vocab:  # the dense state drops the padding: still zero after the steps?
            check_padded_rows(m.weight, None, m.real_rows, f"{type(m).__name__} after training")

    return case


def resume():
    """2 steps at tp = 4, the dense weights and AdamW state gathered, loaded at dp 2 x tp 2
    (padded from 257 to 260, then to 258), 1 more step: the dense run's 3 losses."""
    minipar.init()
    first, second = spec_for(1, 4), spec_for(2, 2, steps=1)
    mesh = DeviceMesh(1, 4, 1)
    losses, part, opt = training.train_on_mesh(first, mesh)
    state = training.dense_state(part, mesh)
    optimizer = training.mesh_optimizer_state(part, opt)
    assert optimizer["embed.tok.weight"]["exp_avg"].shape == (257, 32)
    model = GPT(MODEL)
    model.load_state_dict(state)
    mesh = DeviceMesh(2, 2, 1)
    more, _, _ = training.train_on_mesh(second, mesh, None, model, 2, "cpu", optimizer)
    reference = training.train_dense(spec_for(1, 1, steps=3))[0]
    both = losses + more
    assert not training.compare(both, reference, {}, {}), (both, reference)


# -- bad input ---------------------------------------------------------------------------------
def bad_input():
    """The same ValueError on every rank, before any message."""
    _, p = me()
    attempts = [
        (lambda: VocabParallelEmbedding(V, H, vocab_multiple=0), "vocab_multiple must be a"),
        (lambda: VocabParallelHead(H, V, vocab_multiple=2.0), "got 2.0"),
        (lambda: VocabParallelEmbedding(0, H), "vocab_size must be a positive integer, got 0"),
        (
            lambda: vocab_parallel_cross_entropy(
                torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), vocab_size=5 * p + 1
            ),
            f"vocab_size must be an int in 1..{5 * p}",
        ),
    ]
    seen = []
    with minipar.trace() as t:
        for make, words in attempts:
            try:
                make()
            except ValueError as e:
                assert words in str(e), str(e)
                seen.append(str(e))
            else:
                raise AssertionError(f"no ValueError for {words!r}")
    assert not t.messages, "bad input must raise before any byte moves"
    everyone = minipar.init().allgather_object(seen)
    assert all(other == seen for other in everyone), everyone


def cases(size):
    table = {}
    for multiple in (1, 8, 128):
        table[f"embedding.m{multiple}"] = embedding_case(multiple)
        table[f"head.m{multiple}.bias"] = head_case(multiple, True)
    table["head.m1.nobias"] = head_case(1, False)
    table["cross_entropy.vocab_size"] = cross_entropy_vocab_size
    table["inert.m1"] = inert_padding(1)
    table["inert.m8"] = inert_padding(8)
    table["gpt.V67"] = gpt_case(67)
    table["gpt.V251.tied"] = gpt_case(251, tied=True)
    table["gpt.V50257"] = gpt_case(50257)
    table[f"train.dp1_tp{size}"] = train_case(1, size)
    if size == 4:
        table["train.dp2_tp2"] = train_case(2, 2)
        table["resume.tp4_to_dp2_tp2"] = resume
    table["bad"] = bad_input
    return table
