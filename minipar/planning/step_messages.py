"""The messages of one training step of a GPT on a dp x tp x pp mesh, as `minipar train` sends
them: which collectives on which group, and how many message-steps lie on the critical path.

    step_messages.calls(model, layout, stage)     # [Calls(axis, collective, nbytes, count, what)]
    step_messages.message_steps(model, layout)    # {"tp": n, "pp": n, "dp": n} per step

A rank of pipeline stage s (P = pp stages of L/P blocks, m micro-batches of b sequences of s
tokens, hidden h), read off the code that sends:
- tp group (tp > 1), per micro-batch: 4 all-reduces of the b s h activations per block (the
  attention's and the MLP's g forward and f backward, parallel/tensor/operators.py); on the
  first stage 1 more (the vocabulary-parallel embedding's g), on the last 1 more (the head's f
  backward) and the loss's 2 all-reduces of 1 and 2 numbers per token (cross_entropy.py).
- pp group (P > 1), per micro-batch: the activation received and sent forward, its gradient
  received and sent backward (one of each at the end stages; pipeline/interpreter); per step
  the agreement on the layout (allgather_object: 2 of MPI's own all-gathers, outside minipar's
  ledger) and the loss's broadcast from the last stage (8 bytes, models/mesh_model.py).
- dp group (dp > 1), per step: DDP's gradient all-reduce (one per 25 MiB bucket), its `used`
  map (1 byte per parameter tensor) and the loss's all-reduce (8 bytes); with FSDP (zero 3) per
  sharding unit (each block, the embedding, the head) and micro-batch 2 all-gathers (forward,
  backward; the embedding's backward needs none) and 1 reduce-scatter of the unit's weights
  instead of the gradient all-reduce.
Each collective runs the algorithm `auto` picks for its size (minipar.cost on the default
link, as on the ranks), in cost.traffic's steps; a point-to-point message is one step. DDP's
buckets and FSDP's reduce-scatters above 64 KiB take the ring (parallel/data/ddp.py
`reduction_algorithm`), and with `windows` (the dp group's ranks share a node over MPI, fast
paths on: their buffers live in a shared window) every DDP bucket and FSDP vector above 64 KiB
is reduced or gathered in place, "ring@shm", in 2 steps (all-reduce) or 1 (the ledger's).

The critical path (what `message_steps` counts): a pipeline runs m + P - 1 slots, each as long
as the busiest stage's micro-batch, so the busiest stage's tp steps per micro-batch times
m + P - 1; 2 (m + P - 1) hops forward and back, plus the agreement and the broadcast; the dp
calls of the busiest stage once. tests/test_plan.py checks `calls` against minipar.trace's
ledger of real training steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minipar import cost

AXES = ("tp", "pp", "dp")
P2P = ("send", "recv")
BUCKET_BYTES = 25 << 20  # DistributedDataParallel's default bucket_cap_mb
WINDOW_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # in place: fast/in_place


@dataclass(frozen=True)
class Calls:
    """`count` calls of `collective` per step on the `axis` group, each of `nbytes` (the
    buffer, as minipar.cost counts it; "send"/"recv": one point-to-point message)."""

    axis: str
    collective: str
    nbytes: float
    count: int
    what: str
    traced: bool = True  # False: outside minipar's ledger (mpi4py's control plane)
    algorithm: str = "auto"  # what runs: auto's pick, or a name (flat_algorithm)


def flat_algorithm(collective: str, nbytes: float, windows: bool) -> str:
    """What a DDP bucket's all-reduce or an FSDP vector's all-gather or reduce-scatter runs:
    above cost.SHM_MIN_BYTES the ring (the reductions ask for it; a window vector's all-gather
    under auto takes it too), in place when the buffers live in a window; below, auto's pick."""
    if nbytes <= cost.SHM_MIN_BYTES:
        return "auto"
    if windows:
        return "ring@shm"
    return "auto" if collective == "all_gather" else "ring"


def stage_params(model, tp: int, pp: int, stage: int) -> tuple[float, int]:
    """(parameters, parameter tensors) one tp rank of pipeline stage `stage` holds: column-
    parallel weights and biases split by tp, row-parallel biases and LayerNorms whole."""
    h, f, V = model.hidden, model.ffn or 4 * model.hidden, model.vocab
    block = (4 * h * h + 2 * h * f + 3 * h + f) / tp + 2 * h + 4 * h  # + proj/fc2 biases, 2 LNs
    params, tensors = model.layers // pp * block, 12 * (model.layers // pp)
    if stage == 0:
        params, tensors = params + V * h / tp + model.seq_len * h, tensors + 2
    if stage == pp - 1:
        params, tensors = params + 2 * h + V * h / tp, tensors + 3
    return params, tensors


def group_sizes(lay) -> dict:
    """{axis: ranks in that axis's group} of a layout."""
    return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp}


def calls(model, lay, stage: int, value_bytes: int = 4, zero: int = 0, windows=False) -> list:
    """The collectives and messages of one step on a rank of pipeline stage `stage` (windows:
    the dp group's buffers live in a shared window; see the module)."""
    m, P, tokens = lay.microbatches, lay.pp, lay.micro_batch * model.seq_len
    first, last, out = stage == 0, stage == P - 1, []
    act = tokens * model.hidden * value_bytes  # one micro-batch's activations
    if lay.tp > 1:
        blocks = 4 * (model.layers // P) + first + last  # + embedding's g, head's f
        out.append(Calls("tp", "all_reduce", act, blocks * m, "activations: g forward, f back"))
        if last:
            out.append(Calls("tp", "all_reduce", tokens * 4, m, "loss: max logit per token"))
            out.append(Calls("tp", "all_reduce", 2 * tokens * 4, m, "loss: sum exp, target"))
    if P > 1:
        for kind in P2P:  # an end stage sends (and receives) one way only
            out.append(Calls("pp", kind, act, m * (2 - first - last), "activations, gradients"))
        # mpi4py's Iallgather of the sizes, then Iallgatherv of the pickled views
        out.append(Calls("pp", "all_gather", 64, 2, "agree on the layout", traced=False))
        out.append(Calls("pp", "broadcast", 8, 1, "the loss, from the last stage"))
    if lay.dp > 1:
        params, tensors = stage_params(model, lay.tp, P, stage)
        if zero >= 3:
            units = model.layers // P + first + last
            unit = params / units * 4
            gathers = (2 * units - first) * m  # the embedding's backward needs no weights
            for collective, count, what in (
                ("all_gather", gathers, "FSDP: weights"),
                ("reduce_scatter", units * m, "FSDP: gradients"),
            ):
                algorithm = flat_algorithm(collective, unit, windows)
                out.append(Calls("dp", collective, unit, count, what, algorithm=algorithm))
        else:
            buckets = math.ceil(params * 4 / BUCKET_BYTES)
            bucket = params * 4 / buckets
            algorithm = flat_algorithm("all_reduce", bucket, windows)
            out.append(Calls("dp", "all_reduce", bucket, buckets, "DDP: gradients",
                             algorithm=algorithm))  # fmt: skip
            out.append(Calls("dp", "all_reduce", tensors, 1, "DDP: used map"))
        out.append(Calls("dp", "all_reduce", 8, 1, "the loss"))
    return out


def algorithm(collective: str, nbytes: float, p: int, name: str = "auto") -> str:
    """What runs for this call: `name`, or what `auto` runs (registry.pick prices the built-ins
    on the default link); "p2p" for a point-to-point message."""
    if collective in P2P:
        return "p2p"
    if name != "auto":
        return name
    # here, not at the top of the file: numpy loads only when used
    from minipar.collectives import registry

    return registry.pick(collective, "auto", int(nbytes), p)[0]


def steps_of(call: Calls, p: int) -> int:
    """Message-steps of one call on a group of p ranks."""
    if p == 1:
        return 0
    if call.collective in P2P:
        return 1
    if not call.traced:  # mpi4py's allgather: log2 p rounds (recursive doubling or Bruck)
        return (p - 1).bit_length()

    name = algorithm(call.collective, call.nbytes, p, call.algorithm)
    if name.endswith("@shm"):
        return WINDOW_STEPS[call.collective]
    return cost.traffic(call.collective, name, call.nbytes, p).steps


def signature(model, lay, stage: int, value_bytes: int = 4, zero: int = 0, windows=False) -> dict:
    """{(axis, collective, algorithm, steps): calls} of a stage's step, the traced calls only:
    what a ledger of the same step holds (tests compare the two)."""
    sizes = group_sizes(lay)
    out: dict = {}
    for c in calls(model, lay, stage, value_bytes, zero, windows):
        if c.traced:
            p = sizes[c.axis]
            name = algorithm(c.collective, c.nbytes, p, c.algorithm)
            key = (c.axis, c.collective, name, steps_of(c, p))
            out[key] = out.get(key, 0) + c.count
    return out


def message_steps(model, lay, zero: int = 0, value_bytes: int = 4, windows=False) -> dict:
    """Message-steps on a step's critical path, per axis (see the module's docstring)."""
    sizes = group_sizes(lay)
    m, P = lay.microbatches, lay.pp
    tp_per_micro, dp = 0.0, 0.0
    for stage in range(P):
        per_axis = {axis: 0.0 for axis in AXES}
        for c in calls(model, lay, stage, value_bytes, zero, windows):
            if c.axis != "pp":
                per_axis[c.axis] += c.count * steps_of(c, sizes[c.axis])
        tp_per_micro = max(tp_per_micro, per_axis["tp"] / m)
        dp = max(dp, per_axis["dp"])
    pp = 0.0
    if P > 1:
        once = [c for c in calls(model, lay, P - 1, value_bytes, zero) if c.axis == "pp"]
        pp = 2 * (m + P - 1) + sum(
            c.count * steps_of(c, P) for c in once if c.collective not in P2P
        )
    return {"tp": tp_per_micro * (m + P - 1), "pp": pp, "dp": dp}
