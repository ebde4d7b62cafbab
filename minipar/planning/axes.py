"""Context and expert parallelism priced for the planner: what each moves per layer, and how much
of it a step waits for. The planner (planner.py) adds these terms to a layout's memory and time.

    ring_bytes(b, s, h, tp, cp, value_bytes)      # (forward, backward) bytes one rank sends
    ulysses_bytes(b, s, h, tp, cp, value_bytes)   # per attention layer, per micro-batch
    expert_bytes(tokens, h, top_k, ep, value_bytes)   # per MoE layer, per micro-batch

Context parallelism (cp ranks share each sequence; lesson 09, minipar.parallel.context). A
rank holds L = s/cp tokens of each of its b sequences and h/tp of the hidden width (its tp
rank's heads); one shard of q (or k, v, the output) is N = b L (h/tp) values.
- memory: every activation is per token, so a rank stores 1/cp of them (the attention scores
  are never stored whole: ring and Ulysses keep flash attention's per-query log-sum-exp);
- ring: forward, cp - 1 steps, each sending this rank's current K/V block (2N) to the right
  neighbour while the next one arrives; backward, cp - 1 steps sending the K/V block and the
  dK/dV travelling with it (4N): 3 (cp - 1) 2N bytes per layer. Each step's message overlaps
  that step's block product (load-balanced causal layout: one half block per step after the
  first, 2 b L^2 (h/tp) FLOPs forward, twice that backward), so a step waits only for
  max(0, message - compute);
- Ulysses: 4 all-to-alls of N forward (q, k, v to heads; out back), 4 backward, each sending
  (cp - 1)/cp of it, with nothing to overlap: all exposed.
The group: cp ranks tp apart (tp-cp-dp-pp), on NVLink when tp x cp fit in a node.

Expert parallelism (MoE layers every other block, experts over ep of the dp ranks; lesson 10,
minipar.parallel.expert). A rank routes T = b s / cp tokens per micro-batch to top_k experts.
- memory: the experts' weights, gradients and optimizer state divided by ep (and by pp, as
  every layer), not by tp (minipar keeps the experts whole on every tp rank); ZeRO shards them
  over the ranks that share them, dp x cp / ep; an MoE layer stores top_k MLPs' activations
  per token instead of one;
- traffic: per MoE layer, 4 all-to-alls (dispatch and combine, forward and backward), each a
  buffer of top_k T h values of which (ep - 1)/ep leave the rank, evenly routed (imbalance
  raises the busiest rank's share); on the critical path, not overlapped;
- the experts' gradients: one all-reduce over the dp x cp / ep ranks sharing them, added to the
  data-parallel term (hidden behind backward like it);
- compute: top_k MLPs per token in an MoE layer: (top_k - 1) more MLPs' FLOPs than the dense
  layer. The ep group spans ep x cp x tp consecutive ranks.
"""

from __future__ import annotations

from minipar import cost


def ring_bytes(b: int, s: int, h: int, tp: int, cp: int, value_bytes: int) -> tuple[float, float]:
    """(forward, backward) bytes one rank sends in one attention layer's ring."""
    if cp == 1:
        return 0.0, 0.0
    block = 2 * b * (s / cp) * (h / tp) * value_bytes  # this rank's K and V
    return (cp - 1) * block, 2 * (cp - 1) * block


def ulysses_bytes(b: int, s: int, h: int, tp: int, cp: int, value_bytes: int) -> tuple:
    """(forward, backward) bytes one rank sends in one attention layer's 4 + 4 all-to-alls."""
    if cp == 1:
        return 0.0, 0.0
    shard = b * (s / cp) * (h / tp) * value_bytes
    return 4 * (cp - 1) / cp * shard, 4 * (cp - 1) / cp * shard


def expert_bytes(tokens: float, h: int, top_k: int, ep: int, value_bytes: int) -> float:
    """Bytes one rank sends in one MoE layer's 4 all-to-alls, evenly routed."""
    return 4 * (ep - 1) / ep * top_k * tokens * h * value_bytes


def block_seconds(b: int, s: int, h: int, tp: int, cp: int, rate: float) -> float:
    """One ring step's block product, forward: half an L x L block of this rank's heads."""
    local = s / cp
    return 2 * b * local * local * (h / tp) / rate


def ring_time(b, s, h, tp, cp, value_bytes, link: cost.Link, rate: float) -> float:
    """Exposed seconds of one attention layer's ring, forward and backward: each step waits
    for max(0, its message - its block product)."""
    if cp == 1:
        return 0.0
    block = 2 * b * (s / cp) * (h / tp) * value_bytes
    compute = block_seconds(b, s, h, tp, cp, rate)
    forward = max(0.0, link.alpha + block * link.beta - compute)
    backward = max(0.0, link.alpha + 2 * block * link.beta - 2 * compute)
    return (cp - 1) * (forward + backward)


def ulysses_time(b, s, h, tp, cp, value_bytes, link: cost.Link) -> float:
    """Seconds of one attention layer's 8 all-to-alls (pairwise), all on the critical path."""
    if cp == 1:
        return 0.0
    shard = b * (s / cp) * (h / tp) * value_bytes
    return 8 * cost.predict("all_to_all", "pairwise", shard, cp, link)


def expert_time(tokens, h, top_k, ep, value_bytes, link: cost.Link) -> float:
    """Seconds of one MoE layer's 4 all-to-alls (pairwise), evenly routed, not overlapped."""
    if ep == 1:
        return 0.0
    return 4 * cost.predict("all_to_all", "pairwise", top_k * tokens * h * value_bytes, ep, link)


def moe_extra_flops(model, recompute: bool = False) -> float:
    """The FLOPs an MoE model's step adds to the dense formula: (top_k - 1) more MLPs per token
    in every MoE layer (2 matmuls of h x ffn: 4 h ffn FLOPs a token forward; training 3 times
    that, 4 with recomputation) and the router (2 h E a token, the same factor)."""
    if not model.experts:
        return 0.0
    ffn = model.ffn or 4 * model.hidden
    tokens = model.global_batch * model.seq_len
    per_token = (model.top_k - 1) * 4 * model.hidden * ffn + 2 * model.hidden * model.experts
    return (4 if recompute else 3) * per_token * tokens * model.moe_layers
