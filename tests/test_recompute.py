"""Recomputation and activation memory on one process (the meshes: tests/ranks/gpt_recompute.py).

- the dense tiny GPT with recompute none, selective and full: the same loss and bitwise the
  same gradients; the bytes each block keeps per micro-batch equal models/memory.py's formula
  (to the byte; asked: within 10%), for several micro-batch sizes; nothing left after backward;
- a second backward through a retained graph recomputes again (zero-bubble's W after B);
- the planner's per-layer terms: Korthikanti et al.'s for 16-bit with dropout (the GPU
  presets), within 1% of the measured formula for minipar's GPT (fp32, no dropout);
- the counter itself: two views of one storage count once, parameters not at all.
"""

import pytest
import torch

from minipar.models import memory
from minipar.models.config import RECOMPUTE, GPTConfig, RunSpec
from minipar.models.gpt import Block, build_gpt, lm_loss
from minipar.parallel import activation_memory, recompute
from minipar.planning import planner

SMALL = GPTConfig(seq_len=32, hidden=32, n_layers=2, n_heads=4)


def run(policy, config=SMALL, batch=4, seed=0):
    """(loss, {name: grad}, counter, per-layer bytes) of one forward and backward."""
    model = build_gpt(config, seed)
    recompute.apply(model, policy, blocks=(Block,))
    handles = activation_memory.label_layers({f"blocks.{i}": b for i, b in enumerate(model.blocks)})
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, config.vocab_size, (batch, config.seq_len), generator=g)
    with activation_memory.ActivationMemory(model.parameters()) as mem:
        loss = lm_loss(model(x), x)
        kept = mem.live
        loss.backward()
    for h in handles:
        h.remove()
    grads = {n: q.grad.clone() for n, q in model.named_parameters()}
    return loss.item(), grads, mem, kept, memory.per_layer(mem, 1)


@pytest.mark.parametrize("batch", [1, 4])
def test_recompute_is_bitwise_and_keeps_what_the_formula_says(batch):
    base_loss, base_grads, _, base_kept, _ = run("none", batch=batch)
    kept = {}
    for policy in RECOMPUTE:
        loss, grads, mem, kept[policy], layers = run(policy, batch=batch)
        assert loss == base_loss, policy
        assert all(torch.equal(grads[n], base_grads[n]) for n in base_grads), policy
        assert mem.live == 0, "everything let go after backward"
        want = memory.layer_bytes(SMALL, batch, 1, policy)
        assert set(layers) == {"blocks.0", "blocks.1"}
        for name, got in layers.items():
            assert abs(got - want) <= 0.1 * want, (policy, name, got, want)
            assert got == want, (policy, name, got, want)  # in fact to the byte
    assert kept["full"] < kept["selective"] < kept["none"] == base_kept


def test_full_keeps_only_the_block_input_and_selective_drops_the_softmax():
    s, b, h, a = SMALL.seq_len, 4, SMALL.hidden, SMALL.n_heads
    none, sel, full = (memory.layer_bytes(SMALL, b, 1, p) for p in ("none", "selective", "full"))
    assert full == 4 * s * b * h
    assert none - sel == 4 * a * s * s * b  # the softmax's (b, a, s, s) float32 output


def test_retained_graph_recomputes_again():
    """Zero-bubble's B then W: two backward passes through one graph, each unpacking."""
    torch.manual_seed(0)
    block = recompute.recomputed(Block(SMALL))
    plain = Block(SMALL)
    plain.load_state_dict(block.state_dict())
    x = torch.randn(2, SMALL.seq_len, SMALL.hidden, requires_grad=True)
    outs = [m(x).pow(2).sum() for m in (block, plain)]
    gx = [torch.autograd.grad(o, [x], retain_graph=True)[0] for o in outs]
    gw = [torch.autograd.grad(o, list(m.parameters())) for o, m in zip(outs, (block, plain))]
    assert torch.equal(gx[0], gx[1])
    assert all(torch.equal(a, b) for a, b in zip(*gw))


def test_a_planted_difference_in_the_replay_is_caught():
    """The bitwise check can fail: a replay that perturbs what it hands back changes a grad."""
    original = recompute.Frame.replay

    def perturbed(self):
        original(self)
        self.slots = {i: t + 1e-3 if t.is_floating_point() else t for i, t in self.slots.items()}

    recompute.Frame.replay = perturbed
    try:
        _, grads, *_ = run("full")
    finally:
        recompute.Frame.replay = original
    _, base, *_ = run("none")
    assert not all(torch.equal(grads[n], base[n]) for n in base)


def test_counter_counts_storages_once_and_no_parameters():
    w = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    with activation_memory.ActivationMemory([w]) as mem:
        y = (x @ w).relu()  # keeps x (w excluded) and relu's output
        z = y[:2].sum() + y[2:].sum()  # views: no more
        assert mem.live == x.numel() * 4 + y.numel() * 4
    z.backward()
    assert mem.live == 0 and mem.peak == 2 * 16 * 8


def test_planner_terms():
    big = planner.MODELS["7b"]
    s, h, a = big.seq_len, big.hidden, big.heads
    for t in (1, 2, 8):
        paper = s * h * (10 + 24 / t + 5 * a * s / (h * t))  # Korthikanti Table 2, b = 1
        assert planner.layer_activations(big, t, 1, "none", 2) == pytest.approx(paper)
        assert planner.layer_activations(big, t, 1, "selective", 2) == pytest.approx(
            s * h * (10 + 24 / t)
        )
    assert planner.layer_activations(big, 8, 1, "full", 2) == 2 * s * h
    tiny, config = planner.MODELS["tiny"], GPTConfig()
    for policy in RECOMPUTE:
        for t in (1, 2, 4):
            ours = memory.layer_bytes(config, 8, t, policy)
            got = planner.layer_activations(tiny, t, 8, policy, 4)
            assert abs(got - ours) <= 0.01 * ours, (policy, t, got, ours)  # LayerNorm stats
    assert planner.recompute_policy(True) == "full" and planner.recompute_policy(False) == "none"
    flops = {p: tiny.train_flops(p) for p in RECOMPUTE}
    assert flops["none"] < flops["selective"] < flops["full"]


def test_policies_and_validation():
    assert RECOMPUTE == recompute.POLICIES
    with pytest.raises(ValueError, match="recompute must be one of none, selective, full"):
        RunSpec(recompute="some").validate()
    with pytest.raises(ValueError, match="recompute must be one of"):
        recompute.apply(Block(SMALL), "partial")
