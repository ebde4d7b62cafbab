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
