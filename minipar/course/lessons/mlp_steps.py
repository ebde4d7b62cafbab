"""The MLP lesson 05 trains, its data, and one training step timed across the ranks (the
lesson's sections and its section on nodes, sharding_across_nodes.py, share them)."""

from __future__ import annotations

import statistics
import time

from minipar.course.lessons.page import Page


def widths(quick: bool) -> tuple[int, ...]:
    return (64, 128, 128, 64) if quick else (256, 512, 512, 512, 256)


def build(quick: bool, w: tuple[int, ...] | None = None):
    import torch
    from torch import nn

    torch.manual_seed(0)
    w = w or widths(quick)
    layers = []
    for a, b in zip(w[:-1], w[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def data(page: Page, w: tuple[int, ...] | None = None):
    import torch

    g = torch.Generator().manual_seed(page.rank)
    w = w or widths(page.quick)
    return torch.randn(16, w[0], generator=g), torch.randn(16, w[-1], generator=g)


def one_step(model, x, y, after=None) -> None:
    for param in model.parameters():
        param.grad = None
    ((model(x) - y) ** 2).mean().backward()
    if after is not None:
        after()


def step_spread(page: Page, model, x, y, after=None, reps: int = 5) -> tuple:
    """(min, median, max) over reps of forward + backward (+ after()), the slowest rank's time,
    after one untimed step; the steps of the variants are timed one after another."""
    times = []
    for _ in range(reps + 1):
        for param in model.parameters():
            param.grad = None
        page.comm.barrier()
        t0 = time.perf_counter()
        ((model(x) - y) ** 2).mean().backward()
        if after is not None:
            after()
        times.append(max(page.gather(time.perf_counter() - t0)))
    return min(times[1:]), statistics.median(times[1:]), max(times[1:])
