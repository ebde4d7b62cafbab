"""The messages of one training step of a GPT on a dp x cp x tp x pp mesh, as `minipar train`
sends them: which collectives on which group, and how many message-steps lie on the critical
path.

    step_messages.calls(model, layout, stage)     # [Calls(axis, collective, nbytes, count, what)]
    step_messages.message_steps(model, layout)    # {"tp": n, "pp": n, "dp": n} per step
                                                  # (+ "cp", "ep", "expert_dp" where they exist)

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
- cp group (cp > 1), per block and micro-batch: the attention's arguments agreed
  (all_gather_object: 2 all-gathers, of the sizes and of the pickled shapes), then the ring's
  K/V blocks, b (s/cp) (h/tp) x 2 values, sent and received cp - 1 times forward and twice that
  backward (K/V and dK/dV), or Ulysses' 8 all-to-alls of b (s/cp) (h/tp) values
  (minipar/parallel/context/);
- ep group (MoE blocks, ep > 1), per MoE block of the stage and micro-batch: the count
  all-gather ((3 + 2E) int64 per rank) and 4 uneven all-to-alls (pairwise) of the routed
  copies, top_k b (s/cp) h values when evenly routed; per step the experts' gradient all-reduce
  over the expert_dp group (dp x cp / ep ranks) when it has more than one rank;
- dp group (the dp x cp ranks, dp x cp > 1), per step: DDP's gradient all-reduce (one per
  25 MiB bucket; the experts are not in it), its `used` map (1 byte per parameter tensor) and
  the loss's all-reduce (8 bytes); with FSDP (zero 3) per sharding unit (each block, the
  embedding, the head) and micro-batch 2 all-gathers (forward, backward; the embedding's
  backward needs none) and 1 reduce-scatter of the unit's weights instead of the gradient
  all-reduce.
Each collective runs the algorithm `auto` picks for its size (minipar.cost on the default
link, as on the ranks), in cost.traffic's steps; a point-to-point message is one step. DDP's
buckets and FSDP's reduce-scatters above 64 KiB take the ring (parallel/data/ddp.py
`reduction_algorithm`), and with `windows` (the dp group's ranks share a node over MPI, fast
paths on: their buffers live in a shared window) every DDP bucket and FSDP vector above 64 KiB
is reduced or gathered in place, "ring@shm", in 2 steps (all-reduce) or 1 (the ledger's).

The critical path (what `message_steps` counts): a pipeline runs m + P - 1 slots, each as long
as the busiest stage's micro-batch, so the busiest stage's tp (and cp, ep) steps per
micro-batch times m + P - 1 (the ring: 2 (cp - 1) steps a block, its sends and receives
concurrent); 2 (m + P - 1) hops forward and back, plus the agreement and the broadcast; the dp
calls of the busiest stage once. tests/test_plan.py checks `calls` against minipar.trace's
ledger of real training steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minipar import cost

AXES = ("tp", "pp", "dp", "cp", "ep", "expert_dp")
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
    algorithm: str | None = None  # what runs, when `auto` does not decide it by size alone


def flat_algorithm(collective: str, nbytes: float, windows: bool) -> str | None:
    """What a DDP bucket's all-reduce or an FSDP vector's all-gather or reduce-scatter runs:
    above cost.SHM_MIN_BYTES the ring (the reductions ask for it; a window vector's all-gather
    under auto takes it too), in place when the buffers live in a window; below, None: auto's
    pick."""
    if nbytes <= cost.SHM_MIN_BYTES:
        return None
    if windows:
        return "ring@shm"
    return None if collective == "all_gather" else "ring"


def moe_blocks(model, pp: int, stage: int) -> int:
    """MoE blocks (1, 3, 5, ...) among pipeline stage `stage`'s L/pp blocks."""
    if not getattr(model, "experts", 0):
        return 0
    per = model.layers // pp
    return sum(i % 2 for i in range(stage * per, (stage + 1) * per))


def stage_params(model, tp: int, pp: int, stage: int) -> tuple[float, int]:
    """(parameters, parameter tensors) one tp rank of pipeline stage `stage` holds besides the
    experts (what DDP reduces): column-parallel weights and biases split by tp, row-parallel
    biases and LayerNorms whole; an MoE block has its router (E x h, whole) for an MLP."""
    h, f, V = model.hidden, model.ffn or 4 * model.hidden, model.vocab
    block = (4 * h * h + 2 * h * f + 3 * h + f) / tp + 2 * h + 4 * h  # + proj/fc2 biases, 2 LNs
    params, tensors = model.layers // pp * block, 12 * (model.layers // pp)
    moe = moe_blocks(model, pp, stage)  # the MLP out (its fc2 bias whole), the router in
    params += moe * (getattr(model, "experts", 0) * h - (2 * h * f + f) / tp - h)
    tensors -= 3 * moe
    if stage == 0:
        params, tensors = params + V * h / tp + model.seq_len * h, tensors + 2
    if stage == pp - 1:
        params, tensors = params + 2 * h + V * h / tp, tensors + 3
    return params, tensors


def expert_params(model, ep: int, pp: int, stage: int) -> tuple[float, int]:
    """(parameters, tensors) of this rank's experts on stage `stage`: E/ep MLPs per MoE block,
    stacked in 4 tensors (w1, b1, w2, b2)."""
    h, f, moe = model.hidden, model.ffn or 4 * model.hidden, moe_blocks(model, pp, stage)
    experts = getattr(model, "experts", 0) // ep
    return moe * experts * (2 * h * f + f + h), 4 * moe


def group_sizes(lay) -> dict:
    """{axis: ranks in that axis's group} of a layout ("dp": the dp x cp ranks that average the
    gradients)."""
    cp, ep = getattr(lay, "cp", 1), getattr(lay, "ep", 1)
    dp = lay.dp * cp
    return {"tp": lay.tp, "pp": lay.pp, "dp": dp, "cp": cp, "ep": ep, "expert_dp": dp // ep}


def calls(
    model, lay, stage: int, value_bytes: int = 4, zero: int = 0, windows=False
) -> list[Calls]:
    """The collectives and messages of one step on a rank of pipeline stage `stage` (windows:
    the dp group's buffers live in a shared window; see the module)."""
    cp = getattr(lay, "cp", 1)
    m, P, tokens = lay.microbatches, lay.pp, lay.micro_batch * model.seq_len // cp
    first, last, out = stage == 0, stage == P - 1, []
    act = tokens * model.hidden * value_bytes  # one micro-batch's activations (this rank's)
    if lay.tp > 1:
        blocks = 4 * (model.layers // P) + first + last  # + embedding's g, head's f
        out.append(Calls("tp", "all_reduce", act, blocks * m, "activations: g forward, f back"))
        if last:
            out.append(Calls("tp", "all_reduce", tokens * 4, m, "loss: max logit per token"))
            out.append(Calls("tp", "all_reduce", 2 * tokens * 4, m, "loss: sum exp, target"))
    out += context_calls(model, lay, tokens, value_bytes)
    out += expert_calls(model, lay, stage, tokens, value_bytes)
    if P > 1:
        for kind in P2P:  # an end stage sends (and receives) one way only
            out.append(Calls("pp", kind, act, m * (2 - first - last), "activations, gradients"))
        # mpi4py's Iallgather of the sizes, then Iallgatherv of the pickled views
        out.append(Calls("pp", "all_gather", 64, 2, "agree on the layout", traced=False))
        out.append(Calls("pp", "broadcast", 8, 1, "the loss, from the last stage"))
    if group_sizes(lay)["dp"] > 1:
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


def context_calls(model, lay, tokens: int, value_bytes: int) -> list[Calls]:
    """The cp group's calls per step (see the module docstring)."""
    cp = getattr(lay, "cp", 1)
    if cp == 1:
        return []
    n = model.layers // lay.pp * lay.microbatches  # attention layers run on this stage
    shard = tokens * model.hidden // lay.tp * value_bytes  # b (s/cp) (h/tp): one of q, k, v
    out = [
        Calls("cp", "all_gather", 8, n, "attention's inputs agreed: sizes"),
        Calls("cp", "all_gather", 128, n, "attention's inputs agreed: the shapes, pickled"),
    ]
    if getattr(lay, "cp_variant", "ring") == "ulysses":
        out.append(Calls("cp", "all_to_all", shard, 8 * n, "Ulysses: sequence <-> heads"))
        return out
    for kind in P2P:
        out.append(Calls("cp", kind, 2 * shard, 3 * (cp - 1) * n, "ring: K/V, then dK/dV"))
    return out


def expert_calls(model, lay, stage: int, tokens: int, value_bytes: int) -> list[Calls]:
    """The ep and expert_dp groups' calls per step (see the module docstring)."""
    ep, moe = getattr(lay, "ep", 1), moe_blocks(model, lay.pp, stage)
    if not moe:
        return []
    out = []
    if ep > 1:
        n = moe * lay.microbatches
        counts = (3 + 2 * model.experts) * 8
        copies = model.top_k * tokens * model.hidden * value_bytes
        out.append(Calls("ep", "all_gather", counts, n, "MoE: counts per expert"))
        out.append(
            Calls("ep", "all_to_all", copies, 4 * n, "MoE: tokens there and back", True, "pairwise")
        )
    if group_sizes(lay)["expert_dp"] > 1:
        params = expert_params(model, ep, lay.pp, stage)[0]
        out.append(Calls("expert_dp", "all_reduce", params * 4, 1, "experts' gradients"))
    return out


def algorithm(collective: str, nbytes: float, p: int) -> str:
    """What `auto` runs for this call (registry.pick prices the built-ins on the default link),
    "p2p" for a point-to-point message, "mpi" for mpi4py's control plane."""
    if collective in P2P:
        return "p2p"
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

    name = call.algorithm or algorithm(call.collective, call.nbytes, p)
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
            name = c.algorithm or algorithm(c.collective, c.nbytes, p)
            key = (c.axis, c.collective, name, steps_of(c, p))
            out[key] = out.get(key, 0) + c.count
    return out


def message_steps(model, lay, zero: int = 0, value_bytes: int = 4, windows=False) -> dict:
    """Message-steps on a step's critical path, per axis (see the module's docstring): "tp",
    "pp", "dp", and "cp", "ep", "expert_dp" for a layout that has them."""
    sizes = group_sizes(lay)
    m, P = lay.microbatches, lay.pp
    per_micro = {"tp": 0.0, "cp": 0.0, "ep": 0.0}  # inside the layers: every slot's share
    per_step = {"dp": 0.0, "expert_dp": 0.0}  # once a step
    seen = set()
    for stage in range(P):
        per_axis = {axis: 0.0 for axis in AXES}
        for c in calls(model, lay, stage, value_bytes, zero, windows):
            seen.add(c.axis)
            if c.axis == "pp":
                continue
            if c.collective in P2P:  # the ring: 3 sends a step pair, in 2 steps (see above)
                per_axis[c.axis] += c.count * 2 / 3 if c.collective == "send" else 0
                continue
            per_axis[c.axis] += c.count * steps_of(c, sizes[c.axis])
        for axis in per_micro:
            per_micro[axis] = max(per_micro[axis], per_axis[axis] / m)
        for axis in per_step:
            per_step[axis] = max(per_step[axis], per_axis[axis])
    pp = 0.0
    if P > 1:
        once = [c for c in calls(model, lay, P - 1, value_bytes, zero) if c.axis == "pp"]
        pp = 2 * (m + P - 1) + sum(
            c.count * steps_of(c, P) for c in once if c.collective not in P2P
        )
    out = {"tp": per_micro["tp"] * (m + P - 1), "pp": pp, "dp": per_step["dp"]}
    for axis in ("cp", "ep"):
        if axis in seen:
            out[axis] = per_micro[axis] * (m + P - 1)
    if "expert_dp" in seen:
        out["expert_dp"] = per_step["expert_dp"]
    return out
