"""The layout planner (minipar.planner) and `minipar plan`: known cases checked by hand."""

import json

import pytest

from minipar import cost
from minipar.cli import main as cli_main
from minipar.models import GPTConfig
from minipar.planner import (
    CLUSTERS,
    GB,
    ModelSpec,
    best,
    bubble_fraction,
    evaluate,
    plan_layouts,
    state_memory,
)

H100 = CLUSTERS["dgx-h100"]
SEVEN_B = ModelSpec.preset("7b", seq_len=2048, global_batch=256)


def test_model_sizes():
    assert 6.5e9 < SEVEN_B.params < 7.2e9
    for tied in (False, True):  # the planner counts the tiny GPT exactly as the model does
        spec = ModelSpec.preset("tiny", tied_head=tied)
        assert spec.params == GPTConfig(tied_head=tied).n_params()
    guessed = ModelSpec.from_params(7e9)
    assert 0.8 < guessed.params / 7e9 < 1.2 and guessed.hidden % guessed.heads == 0


def test_state_memory_follows_zero():
    p = 1e9  # parameters on this GPU: 2 + 2 + 12 bytes each in mixed precision
    assert sum(state_memory(p, 8, 0, "bf16").values()) == 16 * p
    assert sum(state_memory(p, 8, 1, "bf16").values()) == 4 * p + 12 * p / 8
    assert sum(state_memory(p, 8, 2, "bf16").values()) == 2 * p + 14 * p / 8
    assert sum(state_memory(p, 8, 3, "bf16").values()) == 16 * p / 8
    assert state_memory(p, 1, 0, "fp32") == {"weights": 4 * p, "grads": 4 * p, "optimizer": 8 * p}


def test_7b_on_8x80gb_needs_sharding_at_dp8():
    layouts = plan_layouts(SEVEN_B, H100, gpus=8)
    pure_dp = [lay for lay in layouts if lay.dp == 8]
    assert pure_dp and not any(lay.feasible for lay in pure_dp)  # 16 x 7B = 110 GB > 80 GB
    assert all(lay.memory["total"] > 16 * SEVEN_B.params > 80 * GB for lay in pure_dp)
    sharded = plan_layouts(SEVEN_B, H100, gpus=8, zero=3, micro_batches=[1])
    assert any(lay.feasible for lay in sharded if lay.dp == 8)
    chosen = best(layouts)
    assert chosen is layouts[0] and chosen.feasible
    assert all(chosen.step_time <= lay.step_time for lay in layouts if lay.feasible)


def test_tensor_parallel_stays_inside_a_node():
    layouts = plan_layouts(ModelSpec.preset("70b"), H100, gpus=16, zero=3, recompute=True)
    across = [lay for lay in layouts if lay.tp == 16]
    assert across and all("tp=16 crosses nodes of 8" in lay.problems for lay in across)
    assert all(lay.tp <= 8 for lay in layouts if lay.feasible)
    # the same all-reduce costs more over InfiniBand than over NVLink
    two_nodes = evaluate(ModelSpec.preset("70b"), H100, 1, 16, 1, 1, 3, True, True)
    one_node = evaluate(ModelSpec.preset("70b"), H100, 2, 8, 1, 1, 3, True)
    per_call = lambda lay: lay.time["tp_comm"] / lay.microbatches
    assert per_call(two_nodes) > 2 * per_call(one_node)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (8, 1), (1, 16)])
def test_bubble_is_p_minus_1_over_m_plus_p_minus_1(pp, m):
    spec = ModelSpec.preset("7b", global_batch=m)
    lay = evaluate(spec, H100, 1, 1, pp, 1)
    assert lay.microbatches == m
    assert lay.bubble_fraction == bubble_fraction(pp, m) == (pp - 1) / (m + pp - 1)
    total = lay.time["compute"] + lay.time["bubble"]
    assert lay.time["bubble"] / total == pytest.approx((pp - 1) / (m + pp - 1))


def test_data_parallel_all_reduce_priced_by_the_cost_model():
    lay = evaluate(SEVEN_B, H100, 8, 1, 1, 1, zero=3)
    grads = SEVEN_B.params * 2
    ring = cost.predict("all_reduce", "ring", grads, 8, cost.NVLINK4)
    assert lay.time["dp_total"] == pytest.approx(1.5 * ring)  # ZeRO-3: all-gathers twice
    flops = SEVEN_B.train_flops() / 8 / (H100.peak_flops * H100.efficiency)
    kernels = (36 * SEVEN_B.layers + 20) * lay.microbatches + 10
    assert lay.time["compute"] == pytest.approx(flops + kernels * H100.op_overhead)


def test_bad_input():
    with pytest.raises(ValueError, match="gpus must be a positive integer, got 0"):
        plan_layouts(SEVEN_B, H100, gpus=0)
    with pytest.raises(ValueError, match="zero must be 0, 1, 2 or 3, got 4"):
        plan_layouts(SEVEN_B, H100, gpus=8, zero=4)
    with pytest.raises(ValueError, match="no model preset 'gpt5'"):
        ModelSpec.preset("gpt5")


def test_command(capsys):
    assert cli_main(["plan", "--model", "7b", "--gpus", "8", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "★" in out and "best: dp=" in out
    assert cli_main(["plan", "--model", "tiny", "--cluster", "cpu", "--gpus", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpus"] == 8 and all(
        lay["dp"] * lay["tp"] * lay["pp"] == 8 for lay in data["layouts"]
    )
    assert cli_main(["plan", "--layers", "4"]) == 2
    assert "--layers, --hidden and --heads" in capsys.readouterr().err
