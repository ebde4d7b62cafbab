"""The learning-rate schedule (minipar/models/lr_schedule.py): warm-up, cosine and linear decay
to the floor, constant; a resumed run's rates are the uninterrupted run's; bad values refused."""

import math

import pytest

from minipar.models.config import RunSpec
from minipar.models.lr_schedule import LRSchedule


def test_warmup_then_cosine_to_the_floor():
    s = LRSchedule(peak=1e-3, warmup=4, kind="cosine", floor=1e-4, total=14)
    assert [s.at(i) for i in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert s.at(4) == pytest.approx(1e-3)  # the decay starts at the peak
    assert s.at(9) == pytest.approx(1e-4 + 0.9e-3 * (1 + math.cos(math.pi / 2)) / 2)
    assert s.at(13) == pytest.approx(1e-4 + 0.9e-3 * (1 + math.cos(math.pi * 0.9)) / 2)
    assert s.at(14) == s.at(100) == 1e-4
    rates = [s.at(i) for i in range(4, 14)]
    assert rates == sorted(rates, reverse=True)  # decays monotonically


def test_linear_and_constant():
    lin = LRSchedule(peak=1.0, warmup=0, kind="linear", floor=0.0, total=10)
    assert [lin.at(i) for i in (0, 5, 9, 10)] == pytest.approx([1.0, 0.5, 0.1, 0.0])
    const = LRSchedule(peak=0.5, warmup=2, kind="constant", total=3)
    assert [const.at(i) for i in range(5)] == pytest.approx([0.25, 0.5, 0.5, 0.5, 0.5])


def test_a_resumed_run_takes_the_uninterrupted_rates():
    whole = RunSpec(steps=10, lr=1e-3, warmup=3, lr_schedule="cosine", min_lr=1e-5)
    first = RunSpec(steps=4, lr=1e-3, warmup=3, lr_schedule="cosine", min_lr=1e-5, decay_steps=10)
    second = RunSpec(steps=6, lr=1e-3, warmup=3, lr_schedule="cosine", min_lr=1e-5)
    rates = [first.lr_at(i) for i in range(4)] + [second.lr_at(i, start=4) for i in range(4, 10)]
    assert rates == [whole.lr_at(i) for i in range(10)]


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"kind": "step"}, ["cosine, linear, constant", "'step'"]),
        ({"warmup": -1}, ["warmup", "-1"]),
        ({"floor": 2.0}, ["min lr 2.0", "lr=1.0"]),
    ],
)
def test_bad_schedules_are_refused(kwargs, words):
    with pytest.raises(ValueError) as info:
        LRSchedule(**{"peak": 1.0, "total": 5, **kwargs})
    for word in words:
        assert word in str(info.value)
    with pytest.raises(ValueError, match="clip must be a positive number"):
        RunSpec(clip=0.0).validate()


def test_the_step_finisher_steps_at_the_scheduled_rate():
    """training.finish_step on plain SGD: the rate each step really took, read from how far a
    weight moved (w -= lr g, with g = 1), is the schedule's formula written out here: warm-up
    peak (s + 1) / W, then cosine from peak to the floor over total - W steps."""
    import torch

    from minipar.models.training import finish_step

    peak, floor, warmup, total = 0.5, 0.05, 2, 6
    spec = RunSpec(steps=total, lr=peak, warmup=warmup, lr_schedule="cosine", min_lr=floor)
    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([w], lr=123.0)  # overwritten by the schedule before every step
    taken = []
    for step in range(total):
        before = w.item()
        w.grad = torch.ones(1)
        finish_step(opt, [w], spec, step, 0, None, None, True)
        taken.append(before - w.item())
    want = [peak * (s + 1) / warmup for s in range(warmup)]
    want += [
        floor + (peak - floor) * (1 + math.cos(math.pi * (s - warmup) / (total - warmup))) / 2
        for s in range(warmup, total)
    ]
    assert taken == pytest.approx(want, rel=1e-6)
