"""Planted bugs for the lessons' break-it labs: real code with one realistic mistake each.

Each function looks like the correct one in minipar and has the same signature; its docstring
names the mistake. The labs (`minipar lesson NN --break NAME`) run it and show the check that
catches it. Do not use these anywhere else.
"""

from __future__ import annotations

import numpy as np

import minipar
from minipar.collectives import layout, ring
from minipar.collectives.reduce_op import reduce_
from minipar.comm.transport import buffers


def ring_shift_send_first(comm, x, out) -> None:
    """Lesson 02, `send-first`: every rank sends to its right neighbour, then receives from its
    left. BUG: a send of a large message completes only once the receiver has posted its
    receive (MPI's rendezvous protocol), and every rank is stuck in its send, so nobody
    receives. Small messages slip through (the eager protocol buffers them), which is why the
    bug survives a quick test. The fix is one sendrecv (or isend, irecv, wait)."""
    comm.send(x, (comm.rank + 1) % comm.size)
    comm.recv(out, (comm.rank - 1) % comm.size)


def all_reduce_ring_wrong_chunk(call, x, op) -> None:
    """Lesson 03, `wrong-chunk`: minipar's ring all-reduce with one index off. BUG: in the last
    step of the all-gather phase each rank sends chunk (r - s + 1) instead of (r - s), a chunk
    its right neighbour already has, so the neighbour's one missing chunk is filled with another
    chunk's values. (Run it with a length divisible by the ranks: with uneven chunks the sizes
    differ and the transport raises instead.)"""
    # BEGIN ANSWER ex03_ring_allreduce do: raise ExerciseNotDone("the planted wrong-chunk ring
    # more: is the worked ring with one index off: in the student edition, plant the bug in
    # more: your own ring (exercises/ex03_ring_allreduce.py)")
    p, r = call.size, call.rank
    edges = layout.bounds(len(x), p)
    right, left = (r + 1) % p, (r - 1) % p
    scratch = buffers.empty(x, max(edges[c + 1] - edges[c] for c in range(p)))
    for s in call.rounds(p - 1):  # reduce-scatter: correct
        send_c, recv_c = (r - s - 1) % p, (r - s - 2) % p
        incoming = layout.chunk(x, edges, recv_c)
        tmp = scratch[: len(incoming)]
        call.sendrecv(layout.chunk(x, edges, send_c), right, tmp, left)
        reduce_(incoming, tmp, op)
    for s in call.rounds(p - 1):  # all-gather
        send_c, recv_c = (r - s) % p, (r - s - 1) % p
        if s == p - 2:
            send_c = (r - s + 1) % p  # the planted bug
        call.sendrecv(layout.chunk(x, edges, send_c), right, layout.chunk(x, edges, recv_c), left)
    # END ANSWER


def all_reduce_own_order(call, x, op) -> None:
    """Lesson 03, `last-bit`: gather everyone's vector (a ring all-gather), then each rank adds
    them up locally, starting with its own. BUG: floating-point addition is not associative, so
    each rank's order gives a result that differs in the last bits. Every answer is "close",
    and the replicas of data parallelism slowly drift apart. (minipar reduces each element in
    one place and copies the result, so all ranks are bitwise identical.)"""
    p, r, n = call.size, call.rank, len(x)
    everyone = buffers.empty(x, p * n)
    ring.all_gather_ring(call, everyone, x)  # rank q's vector in everyone[q n : (q + 1) n]
    for k in range(1, p):  # x is already mine; add the others in the order r+1, r+2, ...
        c = (r + k) % p
        reduce_(x, everyone[c * n : (c + 1) * n], op)


def time_async_without_wait(fn, reps: int) -> tuple[float, list]:
    """Lesson 04, `no-wait`: times `fn()` (which starts an async collective and returns its
    Work) reps times. BUG: it never waits for the Work inside the timed region, so it times how
    long it takes to *start* a collective, not to finish one. Returns (seconds per call, the
    Works, which the caller must still wait for)."""
    import time

    works = []
    t0 = time.perf_counter()
    for _ in range(reps):
        works.append(fn())
    return (time.perf_counter() - t0) / reps, works


def float_fingerprint(x) -> str:
    """The exact bits of a float array as hex (what the bitwise check compares)."""
    return np.ascontiguousarray(x).view(np.uint8).tobytes().hex()


def row_parallel_bias_every_rank(layer, x):
    """Lesson 06, `bias-every-rank`: a RowParallelLinear forward that adds the bias where a
    dense layer adds it, right after the matrix product. BUG: each rank's product is only a
    partial sum, and the all-reduce then adds every rank's copy of the bias too, so the output
    carries p times the bias. With bias initialised to zero (a common default) the bug is
    invisible until the bias has trained. The fix: all-reduce first, add the bias once."""
    from torch.nn import functional as F

    # here, not at the top of the file: torch loads only when used
    from minipar.parallel.tensor import operators

    partial = F.linear(x, layer.weight, layer.bias)
    return operators.reduce_from_tensor_parallel_region(partial, layer.group)


def dp_sync_in_cooldown(pipe, sync):
    """Lesson 07, `dp-warmup`: data parallelism beside a 1F1B pipeline, the gradient all-reduce
    started early so it overlaps the other stages' work. Returns the `on_instruction` callback
    for `pipe.step`; `sync()` all-reduces this stage's gradients over its DP group.
    BUG: it fires after the last backward of the cool-down loop (the `warmup` backwards that
    follow the steady phase). A stage whose warm-up is empty (the last one: p - r - 1 = 0) has
    an empty cool-down too, so its gradients are never synchronised: its replicas quietly train
    on different gradients. (The fix: sync after the stage's last backward, whatever phase.)"""
    # here, not at the top of the file: torch loads only when used
    from minipar.parallel.pipeline.schedules import Backward

    m = pipe.n_microbatches
    warmup = min(pipe.p - pipe.rank - 1, m)
    cooldown = range(m - warmup, m)  # micro-batches whose backward is in the cool-down

    def on_instruction(ins):
        if isinstance(ins, Backward) and len(cooldown) and ins.mb == cooldown[-1]:
            sync()

    return on_instruction


def all_reduce_gradients_every_name(model) -> None:
    """Lesson 05, `tied-twice`: a hand-written DDP sync that walks
    `named_parameters(remove_duplicate=False)` (to "see every layer") and all-reduces each
    name's .grad with SUM, then divides each Parameter once by p. BUG: a tied weight (one
    Parameter under two names) is summed twice: the second all-reduce adds p copies of the
    already-summed gradient, so it ends p times the average. Each rank's replicas stay
    identical, so nothing looks wrong until the ledger shows more than 2(p-1)/p Psi moved."""
    p = minipar.get_world_size()
    for _, param in model.named_parameters(remove_duplicate=False):
        minipar.all_reduce(param.grad, algorithm="ring")
    for param in model.parameters():
        param.grad.div_(p)


def moe_forward_without_counts(moe, x):
    """Lesson 10, `no-counts`: an MoE forward that skips the count exchange. BUG: a rank cannot
    know how many rows the others will send it (that depends on their routers), so this one
    guesses "as many as I send each of them", expert by expert. The guess holds only for a
    perfectly symmetric routing; otherwise a receive buffer is the wrong size and minipar's
    transport refuses the message on both ends (other transports write past the buffer or
    hang). The fix is the one all-gather of the counts before any token moves."""
    # here, not at the top of the file: torch loads only when used
    from minipar.parallel.expert import dispatch, exchange

    flat = x.reshape(-1, moe.hidden)
    routing = moe.router(flat)
    plan = dispatch.plan(routing.experts, routing.kept, moe.n_experts, moe.ep)
    guessed = plan.counts[moe.first : moe.first + moe.n_local].repeat(moe.ep, 1)  # per source
    received = exchange.all_to_all(flat[plan.tokens], plan.splits, plan.splits, moe.group)
    perm, per_expert = dispatch.regroup(guessed)
    out = moe.experts(received[perm], per_expert.tolist())
    back = exchange.all_to_all(out[dispatch.inverse_permutation(perm)], plan.splits,
                               plan.splits, moe.group)  # fmt: skip
    return dispatch.combine(back, plan, routing.weights).reshape(x.shape)


def sync_expert_grads_over_token_group(module, mesh) -> None:
    """Lesson 10, `wrong-group`: the experts' gradient sum over the expert-parallel group, the
    ranks that exchange tokens. BUG: those ranks hold *different* experts (that is the point of
    expert parallelism), so summing over them mixes experts, or, with one expert copy per
    group, sums nothing at all; the copies of the *same* expert, on the ranks of the other
    expert-parallel groups (mesh.expert_dp_group), never meet. Nothing crashes: only a
    comparison with the dense twin's gradients shows it."""
    # here, not at the top of the file: torch loads only when used
    from minipar.parallel.expert import sync_expert_grads

    sync_expert_grads(module, group=mesh.ep_group, divide_by=mesh.dp)


def merge_without_rescale(out_a, lse_a, out_b, lse_b):
    """Lesson 09, `forget-rescale`: the online-softmax merge of two key blocks, weighing each by
    exp(lse) directly. BUG: exact on paper, but exp(lse) overflows float32 once a score passes
    about 88: inf / inf is NaN. Ordinary random inputs (scores of a few units) pass every test;
    only inputs with large scores catch it. The fix: subtract the running maximum m =
    max(lse_a, lse_b) before exponentiating, so both weights lie in (0, 1]."""
    # BEGIN ANSWER ex09_online_softmax_merge do: raise ExerciseNotDone("the planted merge is
    # more: the worked merge without its rescaling: in the student edition, plant it in your own
    # more: merge (exercises/ex09_online_softmax_merge.py)")
    # here, not at the top of the file: torch loads only when used
    import torch

    wa, wb = torch.exp(lse_a), torch.exp(lse_b)
    total = wa + wb
    out = (wa / total).unsqueeze(-1) * out_a + (wb / total).unsqueeze(-1) * out_b
    return out, torch.log(total)
    # END ANSWER


def shard_sequence_naive(x, dim: int, group=None):
    """Lesson 09, `naive-split`: this rank's contiguous block of the sequence, used for causal
    ring attention. BUG: under a causal mask query i needs keys 0..i, so rank r's queries need
    the blocks of ranks 0..r: rank cp - 1 does cp times the work of rank 0, and every ring step
    waits for it. Every value is still right, so a check against dense attention passes; only
    the work counted per rank shows it. The fix: the load-balanced layout
    (shard_sequence(x, dim, group, causal=True): chunks r and 2cp - 1 - r)."""
    # here, not at the top of the file: torch loads only when used
    from minipar.parallel.context import shard_sequence

    return shard_sequence(x, dim, group, causal=False)
