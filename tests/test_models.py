"""The dense tiny GPT (minipar.models) on one process: deterministic weights, it learns, its
stages compose to the model, its data and checkpoints."""

import pytest
import torch
from torch import nn

from minipar.models import GPTConfig, build_gpt, checkpoint, lm_loss
from minipar.models.data import Batches, decode, dp_slice, encode, load_text, load_tokens

TINY = GPTConfig(seq_len=32, hidden=32, n_layers=2, n_heads=4)


def train(model, batches, steps, start=0, lr=1e-2):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(start, start + steps):
        inputs, targets = batches.get(step)
        loss = lm_loss(model(inputs), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_init_is_deterministic_and_per_parameter():
    a, b = build_gpt(TINY, seed=3), build_gpt(TINY, seed=3)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    c = build_gpt(TINY, seed=4)
    assert not torch.equal(a.blocks[0].attn.qkv.weight, c.blocks[0].attn.qkv.weight)
    # seeded by name: a deeper model's first blocks are the shallower one's, bit for bit
    deep = build_gpt(GPTConfig(seq_len=32, hidden=32, n_layers=4, n_heads=4), seed=3)
    assert torch.equal(deep.blocks[1].mlp.fc1.weight, a.blocks[1].mlp.fc1.weight)
    # the residual projections start smaller (GPT-2's 1/sqrt(2 n_layers))
    assert a.blocks[0].attn.proj.weight.std() < 0.8 * a.blocks[0].attn.qkv.weight.std()
    assert (a.blocks[0].ln1.weight == 1).all() and (a.blocks[0].mlp.fc1.bias == 0).all()


def test_parameter_count_and_config_errors():
    for tied in (False, True):
        config = GPTConfig(tied_head=tied)
        assert config.n_params() == sum(p.numel() for p in build_gpt(config).parameters())
    with pytest.raises(ValueError, match="hidden=30 is not divisible by n_heads=4"):
        GPTConfig(hidden=30, n_heads=4)
    with pytest.raises(ValueError, match="n_layers must be a positive integer, got 0"):
        GPTConfig(n_layers=0)


def test_dense_model_learns():
    torch.manual_seed(0)
    model = build_gpt(TINY, seed=0)
    losses = train(model, Batches(load_tokens(), 8, TINY.seq_len, seed=0), steps=12)
    assert abs(losses[0] - torch.log(torch.tensor(256.0)).item()) < 0.3  # uniform at the start
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses


def test_stages_compose_to_the_model_and_share_its_modules():
    for tied in (False, True):
        model = build_gpt(GPTConfig(seq_len=16, hidden=32, n_layers=3, n_heads=2, tied_head=tied))
        seq = nn.Sequential(*model.stages())
        x = torch.randint(0, 256, (2, 16))
        assert torch.equal(seq(x), model(x))
        assert len(seq) == 3 + 2 and seq[1] is model.blocks[0]
        assert (model.head.proj.weight is model.embed.tok.weight) == tied


def test_tokenizer_and_batches():
    assert decode(encode("Thunder and lightning.")) == "Thunder and lightning."
    text = load_text()
    assert b"MACBETH" in text and b"THE TEMPEST" in text and 150_000 < len(text) < 500_000
    tokens = load_tokens()
    a, b = Batches(tokens, 4, 16, seed=1), Batches(tokens, 4, 16, seed=1)
    x, y = a.get(7)
    assert torch.equal(x, b.get(7)[0]) and not torch.equal(x, a.get(8)[0])
    assert torch.equal(x[:, 1:], y[:, :-1]) and x.shape == (4, 16) and x.dtype == torch.int64
    assert [dp_slice(8, r, 4) for r in range(4)] == [slice(2 * r, 2 * r + 2) for r in range(4)]
    with pytest.raises(ValueError, match="batch_size=6 is not divisible by dp=4"):
        dp_slice(6, 0, 4)


@pytest.mark.parametrize("tied", [False, True])
def test_checkpoint_resumes_with_the_same_losses(tmp_path, tied):
    config = GPTConfig(seq_len=16, hidden=32, n_layers=2, n_heads=2, tied_head=tied)
    batches = Batches(load_tokens(), 4, 16, seed=2)
    straight = build_gpt(config, seed=1)
    train(straight, batches, 2)
    path = str(tmp_path / "ckpt.pt")
    checkpoint.save(path, straight, step=2)
    after = train(straight, batches, 2, start=2, lr=1e-3)  # a fresh optimizer, as on resume
    resumed, step = checkpoint.load(path)
    assert step == 2 and resumed.config == config
    assert (resumed.head.proj.weight is resumed.embed.tok.weight) == tied
    assert train(resumed, batches, 2, start=step, lr=1e-3) == after
    with pytest.raises(ValueError, match="is for GPTConfig"):
        checkpoint.load_into(build_gpt(TINY), path)
