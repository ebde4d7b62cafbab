"""Lesson 05's model of each way of synchronising gradients (ddp_costs.exposed), worked by hand:
naive's calls at call_s (a call on a gradient backward has just written), DDP's launches at
launch_s (a call on a small tensor), DDP's own work and its closing `used` all-reduce. The ring's
time is written out here: 2(p-1) steps of alpha, 2(p-1)/p n bytes of beta, (p-1)/p n of gamma."""

import pytest

from minipar.cost import Link
from minipar.course.lessons import ddp_costs

ALPHA, BETA, GAMMA = 10e-6, 1e-9, 0.5e-9
LINK = Link("by hand", ALPHA, BETA, GAMMA)
COSTS = ddp_costs.Costs(call_s=40e-6, handoff_s=20e-6, hook_s=3e-6, own_s=90e-6,
                        bucket_s=150e-6, launch_s=6e-6)  # fmt: skip


def ring(n, p):
    return 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * n * BETA + (p - 1) / p * n * GAMMA


@pytest.mark.parametrize("p", [2, 4])
def test_each_variant_prices_what_it_pays(p):
    sizes = [32768, 512, 65536, 512, 32768, 256]
    got = ddp_costs.exposed(COSTS, sizes, p, LINK)
    used = ring(len(sizes), p)  # the `used` map: one byte a parameter
    naive = sum(ring(n, p) for n in sizes) + len(sizes) * 40e-6
    per_parameter = sum(ring(n, p) for n in sizes) + len(sizes) * (6e-6 + 90e-6) + used
    bucket = ring(sum(sizes), p) + 6e-6 + 150e-6 + used
    assert got["naive"] == pytest.approx(naive, rel=1e-12)
    assert got["per parameter"] == pytest.approx(per_parameter, rel=1e-12)
    assert got["one bucket"] == pytest.approx(bucket, rel=1e-12)
