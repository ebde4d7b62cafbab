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
        if pp * cpu.core_share <= 1:  # one stage's ranks fill the cores: pp's waits are hidden
            steps["pp"] = 0
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
    # bytes: 4 per block, the embedding's and the head's (as step_messages counts them)
    assert lay.time["tp_comm"] == pytest.approx(34 * ring + waits)
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


# -- context and expert parallelism (minipar/planning/axes.py) ---------------------------------
def test_cp_divides_the_activations():
    long = ModelSpec.preset("70b", seq_len=32768, global_batch=8)
    for recompute in (True, False):
        one = evaluate(long, H100, 1, 8, 1, 1, recompute=recompute)
        four = evaluate(long, H100, 1, 8, 1, 1, recompute=recompute, cp=4)
        ratio = four.memory["activations"] / one.memory["activations"]
        if recompute:  # only the layers' inputs: exactly a quarter
            assert ratio == pytest.approx(1 / 4)
        else:  # a quarter of the per-token terms, and no s x s scores (block-wise attention)
            t, a, s, h = 8, long.heads, long.seq_len, long.hidden
            assert ratio == pytest.approx((10 + 24 / t) / (10 + 24 / t + 5 * a * s / (h * t)) / 4)
        assert four.gpus == 32 and four.memory["weights"] == one.memory["weights"]


def test_ring_and_ulysses_bytes_per_layer():
    from minipar.planning import axes

    b, s, h, tp, vb = 1, 1024, 512, 1, 4  # lesson 09's shapes: 8 heads of 64, float32
    for cp in (2, 4, 8):
        n = b * s // cp * h * vb  # one shard of q
        assert axes.ring_bytes(b, s, h, tp, cp, vb) == ((cp - 1) * 2 * n, 2 * (cp - 1) * 2 * n)
        assert axes.ulysses_bytes(b, s, h, tp, cp, vb) == (4 * (cp - 1) / cp * n,) * 2
    # lesson 09's table: cp = 2, 2N both; cp = 4, 6N against 3N
    assert axes.ring_bytes(1, 1024, 512, 1, 2, 4)[0] == 2_097_152
    assert axes.ulysses_bytes(1, 1024, 512, 1, 4, 4)[0] == 1_572_864
    assert axes.ring_bytes(b, s, h, tp, 1, vb) == axes.ulysses_bytes(b, s, h, tp, 1, vb) == (0, 0)


def test_cp_comm_is_the_ring_less_what_its_blocks_hide_or_ulysses_all():
    from minipar.planning import axes

    model = ModelSpec.preset("7b", seq_len=32768, global_batch=8)
    link = cost.NVLINK4  # tp x cp = 8 ranks: one node
    ring = evaluate(model, H100, 1, 2, 1, 1, cp=4)
    ulysses = evaluate(model, H100, 1, 2, 1, 1, cp=4, cp_variant="ulysses")
    shape = (1, 32768, model.hidden, 2, 4, 2)  # b, s, h, tp, cp, bf16
    n = model.layers * ring.microbatches
    rate = H100.peak_flops * H100.efficiency
    assert ring.time["cp_comm"] == pytest.approx(n * axes.ring_time(*shape, link, rate))
    shard = 1 * 32768 / 4 * model.hidden / 2 * 2
    a2a = cost.predict("all_to_all", "pairwise", shard, 4, link)
    assert ulysses.time["cp_comm"] == pytest.approx(n * 8 * a2a) and a2a > 0
    # 8192 tokens a rank: the ring's block products hide its K/V on NVLink (lesson 09: from
    # about 2,000), a slow link does not
    assert ring.time["cp_comm"] == 0
    block = 2 * 1 * 8192 * model.hidden / 2 * 2  # this rank's K and V
    slow = cost.Link("slow", 1e-5, 1e-9, 1e-10)
    compute = axes.block_seconds(1, 32768, model.hidden, 2, 4, rate)
    want = 3 * (1e-5 + block * 1e-9 - compute + 1e-5 + 2 * block * 1e-9 - 2 * compute)
    assert axes.ring_time(*shape, slow, rate) == pytest.approx(want) and want > 0


def test_ep_prices_the_all_to_alls_and_divides_the_experts():
    from minipar.planning import axes

    moe = ModelSpec.preset("7b", experts=8, top_k=2, global_batch=64)
    assert moe.moe_layers == 16 and moe.expert_params == 16 * 8 * (2 * 4096 * 16384 + 16384 + 4096)
    lay = evaluate(moe, H100, 8, 1, 1, 1, ep=8)
    tokens = 1 * moe.seq_len  # one micro-batch of one sequence a rank
    a2a = cost.predict("all_to_all", "pairwise", 2 * tokens * moe.hidden * 2, 8, cost.NVLINK4)
    assert lay.time["ep_comm"] == pytest.approx(16 * lay.microbatches * 4 * a2a)
    assert axes.expert_bytes(tokens, moe.hidden, 2, 8, 2) == 4 * 7 / 8 * 2 * tokens * 4096 * 2
    # the experts' weights, gradients and Adam state divide by ep; the rest does not
    one = evaluate(moe, H100, 8, 1, 1, 1, ep=1)
    states = lambda x: x.memory["weights"] + x.memory["grads"] + x.memory["optimizer"]
    assert states(one) - states(lay) == pytest.approx(16 * moe.expert_params * (1 - 1 / 8))
    assert lay.time["ep_comm"] > 0 == one.time["ep_comm"]
    # the planner counts the MoE GPT as minipar.models builds it
    tiny = GPTConfig(n_experts=4, top_k=2)
    assert ModelSpec.preset("tiny", experts=4, top_k=2).params == tiny.n_params()
    # top_k - 1 more MLPs a token in each MoE layer
    extra = moe.train_flops() - ModelSpec.preset("7b", global_batch=64).train_flops()
    assert extra == pytest.approx(3 * moe.global_batch * moe.seq_len * 16 * (
        4 * 4096 * 16384 + 2 * 4096 * 8))  # fmt: skip


def test_layouts_with_cp_and_ep():
    moe = ModelSpec.preset("7b", experts=8, global_batch=64)
    layouts = plan_layouts(moe, H100, 16, cp=2, ep=2)
    assert layouts and all(lay.dp * lay.cp * lay.tp * lay.pp == 16 for lay in layouts)
    assert all(lay.cp == 2 and lay.ep == 2 and lay.dp % 2 == 0 for lay in layouts)
    bad = evaluate(ModelSpec.preset("7b", seq_len=2046), H100, 2, 1, 1, 1, cp=2, ep=2)
    assert "seq=2046 not divisible by 2cp=4" in bad.problems
    assert "ep=2 without experts" in bad.problems
    odd = evaluate(SEVEN_B, H100, 1, 8, 1, 1, cp=8, cp_variant="ulysses")
    assert "heads/tp=32/8 not divisible by cp=8 (Ulysses)" in odd.problems
    with pytest.raises(ValueError, match="gpus=8 is not divisible by cp=3"):
        plan_layouts(SEVEN_B, H100, 8, cp=3)
    with pytest.raises(ValueError, match="cp_variant must be"):
        evaluate(SEVEN_B, H100, 1, 1, 1, 1, cp_variant="zigzag")


def test_command_with_cp_and_ep(capsys):
    argv = ["plan", "--model", "tiny", "--cluster", "cpu", "--gpus", "8", "--cp", "2"]
    assert cli_main([*argv, "--ep", "2", "--experts", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["experts"] == 4
    assert all(lay["cp"] == 2 and lay["ep"] == 2 and lay["dp"] % 2 == 0 for lay in data["layouts"])
    assert cli_main([*argv, "--cp-variant", "ulysses", "--top", "2"]) == 0
    assert "cp=2 (ulysses)" in capsys.readouterr().out
