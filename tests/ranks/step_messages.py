"""The planner's count of a training step's messages (minipar.planning.step_messages) against the
trace ledger of real steps of `minipar train`'s code (run by tests/test_plan.py, one launch of 4
ranks).

For each layout every rank trains two steps of a small GPT on a DeviceMesh and records the
second in minipar.trace(); its collective calls, counted by (group axis, collective, algorithm,
steps), and its point-to-point messages must equal step_messages.signature for its pipeline
stage: the calls and the message-steps the planner prices. With context and expert
parallelism too: the cp group's ring messages or all-to-alls, the ep group's count all-gathers
and all-to-alls, the experts' gradient all-reduce. A group serving two kinds (cp = 1: the
gradients' dp x cp group is the dp group) is named by the first kind that made it, so both
sides name a group by the first mesh kind with its ranks.
"""

import dataclasses
import time
from collections import Counter

import minipar
from minipar import runtime
from minipar.models.config import GPTConfig, RunSpec
from minipar.parallel.mesh import GROUPS
from minipar.planning import planner, step_messages

CONFIG = GPTConfig(seq_len=16, hidden=32, n_layers=4, n_heads=4)
SPEC = planner.ModelSpec(4, 32, 4, seq_len=16, global_batch=8, vocab=CONFIG.vocab_size)
KIND = {"dp": "dp_cp"}  # the planner's axis -> the mesh's kind of group (the rest: the same)


def traced_step(dp, tp, pp, m, fsdp, cp=1, variant="ring", ep=1, experts=0):
    """The ledger of the second training step on this rank, and the mesh."""
    from minipar.models import training  # torch: here, so collecting the tests stays light
    from minipar.models.data import Batches, dp_slice, load_tokens

    config = dataclasses.replace(CONFIG, n_experts=experts)
    spec = RunSpec(dp, tp, pp, m, "1f1b", fsdp, steps=2, model=config, cp=cp,
                   cp_variant=variant, ep=ep)  # fmt: skip
    mesh = training.mesh_for(spec)
    part = training.build_for_mesh(spec, mesh)
    opt = training.make_optimizer_for(part.parameters(), spec.lr)
    batches = Batches(load_tokens(), spec.batch_size, CONFIG.seq_len, spec.seed)
    rows = dp_slice(spec.batch_size, mesh.dp_rank, dp)
    for step in range(2):
        inputs, targets = (part.shard_batch(t[rows]) for t in batches.get(step))
        with minipar.trace() as ledger:  # the same calls as training.train_on_mesh's loop
            opt.zero_grad(set_to_none=True)
            local = part.forward_backward(inputs, targets)
            part.sync_grads()
            opt.step()
            part.global_loss(local)
    return ledger, mesh


def first_kind(mesh, ranks) -> str:
    """The first kind of mesh group (in the order the mesh builds them) with these ranks."""
    return next(kind for kind in GROUPS if set(mesh.global_ranks(kind)) == set(ranks))


def of_group(mesh, name: str) -> str:
    """A ledger's group name, "cp[0, 2]", as the first mesh kind with its ranks."""
    ranks = [int(r) for r in name.split("[")[1].rstrip("]").split(",")]
    return first_kind(mesh, ranks)


def counted(ledger, mesh) -> Counter:
    out = Counter()
    for call in ledger.calls:
        out[of_group(mesh, call.group), call.collective, call.algorithm, call.steps] += 1
    for msg in ledger.messages:
        if msg.collective == "p2p":
            out[of_group(mesh, msg.group), msg.kind, "p2p", 1] += 1
    return out


def check(dp, tp, pp, m, fsdp=False, cp=1, variant="ring", ep=1, experts=0):
    from minipar.collectives.window_buffer import shared_node  # numpy: collecting stays light

    ledger, mesh = traced_step(dp, tp, pp, m, fsdp, cp, variant, ep, experts)
    spec = dataclasses.replace(SPEC, experts=experts)
    lay = planner.evaluate(spec, planner.CLUSTERS["cpu"], dp, tp, pp, 8 // dp // m, cp=cp,
                           ep=ep, cp_variant=variant)  # fmt: skip
    assert lay.microbatches == m
    # the dp group's buffers live in a shared window when its ranks share a node (one here)
    windows = dp * cp > 1 and shared_node(mesh.dp_cp_group, "the dp group") is not None
    want = Counter()
    signature = step_messages.signature(spec, lay, mesh.pp_rank, zero=3 if fsdp else 0,
                                        windows=windows)  # fmt: skip
    for (axis, *rest), n in signature.items():
        want[(first_kind(mesh, mesh.global_ranks(KIND.get(axis, axis))), *rest)] += n
    got = counted(ledger, mesh)
    assert got == want, f"stage {mesh.pp_rank}: traced {dict(got)}, planner {dict(want)}"


def step_latency_measures():
    """The measurement calibrated_cpu takes: positive, finite, the same on every rank."""
    from minipar.bench import step_latency

    got = step_latency.time_per_step(calls=3, blocks=1)
    assert 0 < got["alpha"] < 1 and 0 <= got["beta"] < 1e-3 and 0 < got["share"] <= 1, got
    seen = runtime.default_group().allgather_object((got["alpha"], got["beta"], got["share"]))
    assert all(s == seen[0] for s in seen), seen


def compute_share_outlasts_a_slowdown():
    """The machine slows down after compute_share timed its work (the first block fast, every
    later one 0.15 s): rank 0's blocks outlast the others' sleep, so it measures again with a
    longer sleep instead of failing or returning a share taken while not alone."""
    from minipar.bench import step_latency

    calls = []

    def work():
        calls.append(1)
        time.sleep(0.15 if len(calls) > 1 else 0.0)

    share = step_latency.compute_share(work=work, blocks=1)
    assert 0.5 < share <= 1, share  # sleeping ranks share no core: about 1
    if minipar.get_rank() == 0:  # the timing, the first try (4 blocks), then the second
        assert len(calls) == 1 + 4 + 4 + 4 + 4, len(calls)


def cases(size):
    if size != 4:
        return {}
    return {
        "dp2_tp2_m2": lambda: check(2, 2, 1, 2),
        "tp4": lambda: check(1, 4, 1, 1),
        "tp2_pp2_m2": lambda: check(1, 2, 2, 2),
        "dp2_pp2_fsdp": lambda: check(2, 1, 2, 2, fsdp=True),
        "dp2_cp2_ring": lambda: check(2, 1, 1, 1, cp=2),
        "cp2_tp2_ulysses": lambda: check(1, 2, 1, 1, cp=2, variant="ulysses"),
        "cp2_pp2_m2_ring": lambda: check(1, 1, 2, 2, cp=2),
        "dp4_ep2_moe": lambda: check(4, 1, 1, 1, ep=2, experts=4),
        "dp2_cp2_ep2_moe": lambda: check(2, 1, 1, 1, cp=2, ep=2, experts=4),
        "step_latency": step_latency_measures,
        "compute_share_outlasts_a_slowdown": compute_share_outlasts_a_slowdown,
    }
