"""Mixed precision against torch's own: fp16 computes in torch.float16 (not bfloat16), the loss
scaler and the step finisher take the steps, skips and scales torch.amp.GradScaler takes when
gradients overflow (in one parameter of several, the growth interval, the reset after an
overflow), and the clip's epsilon where the norm is near zero (minipar/models/precision.py,
minipar/parallel/loss_scale.py, training.finish_step, minipar/parallel/clip_grad.py).

The expected values come from torch (torch.float16, GradScaler, clip_grad_norm_) or from a
formula written here, never from the code under test."""

from __future__ import annotations

import pytest
import torch

from minipar.models import precision
from minipar.models.config import RunSpec
from minipar.models.gpt import GPTConfig, build_gpt
from minipar.models.training import finish_step, unscale
from minipar.parallel.clip_grad import clip_grad_norm_
from minipar.parallel.loss_scale import LossScaler


@pytest.mark.parametrize("name,want", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_a_forward_computes_in_the_named_dtype(name, want):
    """Every matmul of the tiny GPT's forward under the policy's autocast outputs `want`
    (torch's own dtype object, not the policy's table); fp32 leaves them float32."""
    model = build_gpt(GPTConfig(seq_len=8, hidden=16, n_layers=1, n_heads=2), seed=0)
    seen = []
    hooks = [
        m.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    x = torch.randint(0, 32, (2, 8))
    with precision.autocast(name):
        model(x)
    with precision.autocast("fp32"):
        model(x)
    for hook in hooks:
        hook.remove()
    half = len(seen) // 2
    assert half > 0 and seen[:half] == [want] * half, seen
    assert seen[half:] == [torch.float32] * half, seen


def _three_parameters():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(4)) for _ in range(3)]


def _loss(params, x, blow_up: int | None):
    """A loss whose gradient is finite, unless `blow_up` names the parameter whose gradient is
    1e38 x larger (inf once scaled by 2^16 in float32): an overflow in one parameter only."""
    terms = [(q * x).sum() * (1e38 if i == blow_up else 1.0) for i, q in enumerate(params)]
    return sum(terms)


# step -> the parameter that overflows (None: a good step): the middle one, the last, the first;
# 3 good steps in a row grow the scale (interval 3), the count starts again after an overflow
OVERFLOWS = [None, None, 1, None, None, None, None, 2, None, 0, None, None, None, None]


def _torch_run(interval: int):
    """torch.amp.GradScaler's documented loop: scale(loss).backward(); step (skipped when any
    gradient is inf/NaN); update (backoff on an overflow, growth after `interval` good)."""
    params = _three_parameters()
    opt = torch.optim.AdamW(params, lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=interval)
    scales, weights = [], []
    for step, blow_up in enumerate(OVERFLOWS):
        opt.zero_grad(set_to_none=True)
        scaler.scale(_loss(params, torch.full((4,), 1.0 + step), blow_up)).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        weights.append([q.detach().clone() for q in params])
    return scales, weights


def _minipar_run(interval: int):
    """The same steps through minipar's scaler and the training step's finisher."""
    params = _three_parameters()
    opt = torch.optim.AdamW(params, lr=0.1)
    scaler = LossScaler(init_scale=2.0**16, interval=interval)
    spec = RunSpec(dtype="fp16", lr=0.1)
    scales, weights, skipped = [], [], []
    for step, blow_up in enumerate(OVERFLOWS):
        opt.zero_grad(set_to_none=True)
        (_loss(params, torch.full((4,), 1.0 + step), blow_up) * scaler.scale).backward()
        ok = unscale(scaler, params)
        done = finish_step(opt, params, spec, step, 0, scaler, None, ok)
        scales.append(scaler.scale)
        weights.append([q.detach().clone() for q in params])
        skipped.append(done["skipped"])
    return scales, weights, skipped


def test_overflows_skip_and_rescale_as_torchs_grad_scaler():
    want_scales, want_weights = _torch_run(interval=3)
    scales, weights, skipped = _minipar_run(interval=3)
    assert skipped == [b is not None for b in OVERFLOWS]
    assert scales == want_scales
    # the sequence reaches every branch: halved, grown, and a halving right after a growth
    assert 2.0**15 in scales and 2.0**16 in scales[3:] and max(scales) == 2.0**16
    for step, (got, want) in enumerate(zip(weights, want_weights)):
        for a, b in zip(got, want):
            assert torch.isfinite(a).all(), f"step {step}: a skipped step moved the weights"
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"step {step}")


def test_growth_and_backoff_by_hand():
    """The documented rule on its own: x2 after `interval` good steps in a row, x0.5 and the
    count reset on an overflow."""
    scaler = LossScaler(init_scale=8.0, interval=2)
    seen = []
    for bad in (False, False, False, True, False, True, False, False):
        q = torch.nn.Parameter(torch.ones(2))
        q.grad = torch.tensor([1.0, float("inf") if bad else 2.0])
        assert scaler.unscale_([q]) is not bad
        scaler.update()
        seen.append(scaler.scale)
    assert seen == [8.0, 16.0, 16.0, 8.0, 8.0, 4.0, 4.0, 8.0]


@pytest.mark.parametrize("tiny", [1e-9, 3e-8, 0.0])
def test_clip_near_zero_norm_uses_torchs_epsilon(tiny):
    """A gradient norm far below 1e-6: the factor is max_norm / (norm + 1e-6), torch's
    epsilon, which here decides it (without it the factor would be ~1e3x larger)."""
    max_norm = 1e-9
    grads = []
    for clip in (torch.nn.utils.clip_grad_norm_, clip_grad_norm_):
        q = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
        q.grad = torch.full((4,), tiny / 2, dtype=torch.float64)  # norm = tiny
        norm = clip([q], max_norm)
        grads.append((float(norm), q.grad.clone()))
    (want_norm, want), (norm, got) = grads
    assert norm == pytest.approx(tiny, abs=1e-18) and want_norm == pytest.approx(norm)
    factor = min(1.0, max_norm / (tiny + 1e-6))  # the formula, written out
    torch.testing.assert_close(got, torch.full((4,), tiny / 2 * factor, dtype=torch.float64))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_a_dense_fp16_run_whose_scale_overflows_skips_its_steps():
    """The dense run itself (train_dense: the loss scaled, backward through float16 matmuls,
    unscale, the finisher) from a scale of 2^40: every gradient overflows float16's 65504, so,
    as GradScaler does, no step moves a weight and each halves the scale."""
    from minipar.models.training import train_dense

    config = GPTConfig(seq_len=8, hidden=16, n_layers=1, n_heads=2)
    spec = RunSpec(steps=3, dtype="fp16", model=config)
    stats = {}
    _, model, _ = train_dense(spec, stats=stats, scaler_state={"scale": 2.0**40, "good_steps": 7})
    assert stats["skipped"] == [True, True, True]
    assert stats["scaler"] == {"scale": 2.0**37, "good_steps": 0}
    start = build_gpt(config, spec.seed).state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(value, start[name]), f"{name} moved on a skipped step"
