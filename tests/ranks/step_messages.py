"""The planner's count of a training step's messages (minipar.planning.step_messages) against the
trace ledger of real steps of `minipar train`'s code (run by tests/test_plan.py, one launch of 4
ranks).

For each layout every rank trains two steps of a small GPT on a DeviceMesh and records the
second in minipar.trace(); its collective calls, counted by (group axis, collective, algorithm,
steps), and its point-to-point messages must equal step_messages.signature for its pipeline
stage: the calls and the message-steps the planner prices.
"""

from collections import Counter

import minipar
from minipar import runtime
from minipar.models.config import GPTConfig, RunSpec
from minipar.planning import planner, step_messages

CONFIG = GPTConfig(seq_len=16, hidden=32, n_layers=4, n_heads=4)
SPEC = planner.ModelSpec(4, 32, 4, seq_len=16, global_batch=8, vocab=CONFIG.vocab_size)


def traced_step(dp, tp, pp, m, fsdp):
    """The ledger of the second training step on this rank, and the mesh."""
    from minipar.models import training  # torch: here, so collecting the tests stays light
    from minipar.models.data import Batches, dp_slice, load_tokens
    from minipar.parallel import DeviceMesh

    spec = RunSpec(dp, tp, pp, m, "1f1b", fsdp, steps=2, model=CONFIG)
    mesh = DeviceMesh(dp, tp, pp)
    part = training.build_for_mesh(spec, mesh)
    opt = training.make_optimizer_for(part.parameters(), spec.lr)
    batches = Batches(load_tokens(), spec.batch_size, CONFIG.seq_len, spec.seed)
    rows = dp_slice(spec.batch_size, mesh.dp_rank, dp)
    for step in range(2):
        inputs, targets = (t[rows] for t in batches.get(step))
        with minipar.trace() as ledger:  # the same calls as training.train_on_mesh's loop
            opt.zero_grad(set_to_none=True)
            local = part.forward_backward(inputs, targets)
            part.sync_grads()
            opt.step()
            part.global_loss(local)
    return ledger, mesh


def counted(ledger) -> Counter:
    out = Counter()
    for call in ledger.calls:
        out[call.group.split("[")[0], call.collective, call.algorithm, call.steps] += 1
    for msg in ledger.messages:
        if msg.collective == "p2p":
            out[msg.group.split("[")[0], msg.kind, "p2p", 1] += 1
    return out


def check(dp, tp, pp, m, fsdp=False):
    from minipar.collectives.window_buffer import shared_node  # numpy: collecting stays light

    ledger, mesh = traced_step(dp, tp, pp, m, fsdp)
    lay = planner.evaluate(SPEC, planner.CLUSTERS["cpu"], dp, tp, pp, 8 // dp // m)
    assert lay.microbatches == m
    windows = dp > 1 and shared_node(mesh.dp_group, "the dp group") is not None  # one node
    want = step_messages.signature(SPEC, lay, mesh.pp_rank, zero=3 if fsdp else 0,
                                   windows=windows)  # fmt: skip
    got = counted(ledger)
    assert got == Counter(want), f"stage {mesh.pp_rank}: traced {dict(got)}, planner {want}"


def step_latency_measures():
    """The measurement calibrated_cpu takes: positive, finite, the same on every rank."""
    from minipar.bench import step_latency

    got = step_latency.time_per_step(calls=3, blocks=1)
    assert 0 < got["alpha"] < 1 and 0 <= got["beta"] < 1e-3 and 0 < got["share"] <= 1, got
    seen = runtime.default_group().allgather_object((got["alpha"], got["beta"], got["share"]))
    assert all(s == seen[0] for s in seen), seen


def cases(size):
    if size != 4:
        return {}
    return {
        "dp2_tp2_m2": lambda: check(2, 2, 1, 2),
        "tp4": lambda: check(1, 4, 1, 1),
        "tp2_pp2_m2": lambda: check(1, 2, 2, 2),
        "dp2_pp2_fsdp": lambda: check(2, 1, 2, 2, fsdp=True),
        "step_latency": step_latency_measures,
    }
