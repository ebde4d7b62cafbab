"""The layout planner (minipar.planning.planner) and `minipar plan`: known cases checked by hand."""

import json

import pytest
from conftest import ranks_suite

from minipar import cost
from minipar.cli import main as cli_main
from minipar.models import GPTConfig
from minipar.planning.planner import (
    CLUSTERS,
    GB,
    ModelSpec,
    best,
    bubble_fraction,
    calibrated_cpu,
    evaluate,
    plan_layouts,
    shared_cores,
    state_memory,
)
from minipar.planning.step_messages import message_steps
from minipar.testing import harness

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


TINY = ModelSpec.preset("tiny")
CPU = CLUSTERS["cpu"]


def test_oversubscribed_message_steps_cost_the_measured_alpha():
    alpha = 3e-3  # seconds per message-step, as measured with 8 ranks on 2 cores
    cpu = calibrated_cpu(8, 2, alpha, peak_flops=50e9)
    wait = alpha - CPU.hierarchy.intra.alpha
    assert cpu.step_wait == pytest.approx(wait)
    plain = shared_cores(CPU, 8, 2, 50e9)
    for dp, tp, pp, micro in [(1, 8, 1, 8), (8, 1, 1, 1), (1, 1, 8, 1), (2, 2, 2, 2)]:
        lay, before = (
            evaluate(TINY, cpu, dp, tp, pp, micro),
            evaluate(TINY, plain, dp, tp, pp, micro),
        )
        steps = message_steps(TINY, lay)
        assert lay.time["waits"] == pytest.approx(sum(steps.values()) * wait)
        for axis in ("tp", "pp", "dp"):  # each axis's waits land in its comm term
            added = lay.time[f"{axis}_comm"] - before.time[f"{axis}_comm"]
            assert added == pytest.approx(steps[axis] * wait)
        unbubbled = lambda x: x.step_time - x.time["bubble"]  # the bubble: its own test
        assert unbubbled(lay) == pytest.approx(unbubbled(before) + lay.time["waits"])
    # 8 ranks of tensor parallelism: 34 all-reduces of the activations a step (4 per block, the
    # embedding's, the head's) in 2 log2(8) = 6 steps (rabenseifner) and the loss's 2 in 3
    # (recursive doubling), all on the critical path
    pure_tp = evaluate(TINY, cpu, 1, 8, 1, 8)
    assert message_steps(TINY, pure_tp) == {"tp": 34 * 6 + 2 * 3, "pp": 0, "dp": 0}
    # pipeline: 2 hops in each of m + p - 1 slots, the agreement (2 all-gathers of 3 steps)
    # and the loss's broadcast (a tree: 3)
    assert message_steps(TINY, evaluate(TINY, cpu, 1, 1, 8, 1))["pp"] == 2 * (8 + 7) + 6 + 3
    # twice the wait, twice the term; the order of the layouts follows the message-steps
    double = calibrated_cpu(8, 2, 2 * alpha - CPU.hierarchy.intra.alpha, peak_flops=50e9)
    assert evaluate(TINY, double, 1, 8, 1, 8).time["waits"] == pytest.approx(
        2 * pure_tp.time["waits"]
    )
    assert pure_tp.step_time > evaluate(TINY, cpu, 8, 1, 1, 1).step_time


def test_cpu_prediction_unchanged_with_a_core_per_rank():
    for ranks, cores in [(2, 2), (2, 4), (1, 1)]:
        cpu = calibrated_cpu(ranks, cores, cost.Link("slow", 5e-3, 1e-9, 1e-9), 50e9)
        assert cpu.step_wait == 0
        for dp, tp, pp in [(ranks, 1, 1), (1, ranks, 1), (1, 1, ranks)]:
            a = evaluate(TINY, cpu, dp, tp, pp, 1).time
            b = evaluate(TINY, shared_cores(CPU, ranks, cores, 50e9), dp, tp, pp, 1).time
            assert a == b and a["waits"] == 0
    assert evaluate(SEVEN_B, H100, 2, 2, 2, 1).time["waits"] == 0  # datacenter presets: none
    with pytest.raises(ValueError, match="alpha must be a non-negative number of seconds"):
        calibrated_cpu(8, 2, -1.0)


STEP_SUITE = ranks_suite("step_messages.py")


@pytest.mark.parametrize("size,name", harness.params(STEP_SUITE, [4]))
def test_message_count_equals_the_traced_step(size, name):
    harness.run_suite(STEP_SUITE, size).check(name)


def test_calibrated_cpu_takes_the_measured_share_and_bytes():
    measured = cost.Link("steps:8on2", 1e-3, 1 / 50e6, 1 / 5e9)  # 50 MB/s within a step
    cpu = calibrated_cpu(8, 2, measured, peak_flops=50e9, share=0.2)
    assert cpu.peak_flops == pytest.approx(0.2 * 50e9)
    assert cpu.op_overhead == pytest.approx(CPU.op_overhead / 0.2)
    assert cpu.hierarchy.intra.beta == cpu.hierarchy.inter.beta == measured.beta
    assert cpu.hierarchy.intra.alpha == CPU.hierarchy.intra.alpha  # the wait is step_wait's
    lay = evaluate(TINY, cpu, 1, 8, 1, 8)
    act = 8 * 64 * 64 * 4  # one micro-batch's activations, fp32
    ring = cost.predict("all_reduce", "ring", act, 8, cpu.hierarchy.intra)
    waits = message_steps(TINY, lay)["tp"] * cpu.step_wait
    assert lay.time["tp_comm"] == pytest.approx(32 * ring + waits)  # bytes: 4 per block
    with pytest.raises(ValueError, match="share must be in"):
        calibrated_cpu(8, 2, measured, share=1.5)


def test_cpu_counts_torch_ops_gpu_presets_keep_theirs():
    from minipar.planning.planner import ops_per_step
    from minipar.planning.step_messages import stage_params

    dense = evaluate(TINY, CPU, 1, 1, 1, 8)
    assert stage_params(TINY, 1, 1, 0)[1] == 101  # the tiny GPT's parameter tensors
    # torch.profiler on the tiny GPT: 86 aten ops a block, 36 outside; AdamW: 9 per tensor
    assert ops_per_step(TINY, dense, CPU) == 86 * 8 + 36 + 9 * 101
    assert ops_per_step(TINY, dense, H100) == ops_per_step(TINY, dense) == 36 * 8 + 20 + 10
    last_stage = evaluate(TINY, CPU, 1, 1, 8, 1)  # 8 micro-batches of one block; 12 + 3 tensors
    assert ops_per_step(TINY, last_stage, CPU) == (86 + 36) * 8 + 9 * 15


def test_oversubscribed_bubble_is_the_fill_and_drain_at_a_whole_core():
    cpu = calibrated_cpu(8, 2, 1e-3, peak_flops=50e9, share=0.2)
    assert cpu.core_share == pytest.approx(0.2) and CPU.core_share == H100.core_share == 1
    lay = evaluate(TINY, cpu, 1, 1, 8, 1)  # 8 stages, 8 micro-batches
    assert lay.time["bubble"] == pytest.approx(lay.time["compute"] * 0.2 * 7 / 8)
    quiet = evaluate(TINY, calibrated_cpu(2, 2, 1e-3, peak_flops=50e9), 1, 1, 2, 1)
    assert quiet.time["bubble"] == pytest.approx(quiet.time["compute"] * 1 / 8)
