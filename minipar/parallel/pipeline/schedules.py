"""Pipeline schedules as data: for each rank, the list of instructions it runs in order.

A schedule never touches a tensor or a message. It says, per rank, which micro-batch to run
forward or backward through which of the rank's chunks, and where activations and gradients
are sent and received. The interpreter (interpreter/pipeline.py) runs the list; the verifier
(verify.py) runs every rank's list at once with no communication at all, to prove that every
send meets its receive, that nothing deadlocks, and to predict the bubble.

Stages and chunks: with p ranks and v virtual stages (chunks) per rank there are S = p*v
stages; rank r holds global stages r, r+p, r+2p, ... (Megatron's interleaving), so chunk c of
rank r is stage c*p + r. With v = 1, chunk 0 is the rank's one stage.

Messages: a micro-batch's activation (its shape: the micro-batch's output of one stage) moves
forward once per stage boundary and its gradient (same bytes) backward once: 2*(S-1)*m messages
per step in all, of activation-size bytes each.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Instruction:
    mb: int  # micro-batch index, 0..m-1
    chunk: int = 0  # which of the rank's virtual stages, 0..v-1

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.mb},{self.chunk})"


class Forward(Instruction):
    """Run micro-batch `mb` forward through chunk `chunk`, keeping what backward needs."""


class Backward(Instruction):
    """Backward of micro-batch `mb` through the chunk: input gradient and weight gradient."""


class BackwardInput(Instruction):
    """Zero bubble's B: only the gradient with respect to the chunk's input (the critical path)."""


class BackwardWeight(Instruction):
    """Zero bubble's W: the weight gradient of a micro-batch whose B already ran."""


class SendActivation(Instruction):
    """Send the chunk's output for `mb` to the next stage."""


class RecvActivation(Instruction):
    """Receive the chunk's input for `mb` from the previous stage (blocks until it arrives)."""


class SendGrad(Instruction):
    """Send the gradient of the chunk's input for `mb` to the previous stage."""


class RecvGrad(Instruction):
    """Receive the gradient of the chunk's output for `mb` from the next stage (blocks)."""


COMPUTE = (Forward, Backward, BackwardInput, BackwardWeight)
SENDS = (SendActivation, SendGrad)
RECVS = (RecvActivation, RecvGrad)


# -- stage arithmetic ------------------------------------------------------------------------
def stage_of(rank: int, chunk: int, p: int) -> int:
    return chunk * p + rank


def place_of(stage: int, p: int) -> tuple[int, int]:
    """(rank, chunk) that holds global stage `stage`."""
    return stage % p, stage // p


def with_comms(compute, rank: int, p: int, v: int) -> list:
    """Wrap a rank's compute order with its messages: a receive right before the compute that
    needs it, a send right after the compute that produced it (sends never block)."""
    last = p * v - 1
    out = []
    for ins in compute:
        stage = stage_of(rank, ins.chunk, p)
        if isinstance(ins, Forward):
            if stage > 0:
                out.append(RecvActivation(ins.mb, ins.chunk))
            out.append(ins)
            if stage < last:
                out.append(SendActivation(ins.mb, ins.chunk))
        elif isinstance(ins, (Backward, BackwardInput)):
            if stage < last:
                out.append(RecvGrad(ins.mb, ins.chunk))
            out.append(ins)
            if stage > 0:
                out.append(SendGrad(ins.mb, ins.chunk))
        else:
            out.append(ins)
    return out


# -- the schedules ---------------------------------------------------------------------------
def gpipe(rank: int, p: int, m: int, v: int = 1):
    """GPipe: every micro-batch forward, then every micro-batch backward.

    Roughly:
        for i in range(m): recv act i; forward i; send act i
        for i in range(m): recv grad i; backward i; send grad i

    Bubble (p-1)/(m+p-1) of the step; holds all m micro-batches' activations at the peak.
    """
    compute = [Forward(i) for i in range(m)] + [Backward(i) for i in range(m)]
    yield from with_comms(compute, rank, p, 1)


def one_f_one_b(rank: int, p: int, m: int, v: int = 1):
    """1F1B (PipeDream-flush): warm-up forwards, then one forward one backward, then cool-down.

    Roughly, on rank `rank`:
        warm-up: forward micro-batches 0 .. w-1, where w = min(p - rank - 1, m)
        steady: forward w + i, then backward i, for i = 0 .. m-w-1
        cool-down: backward m-w .. m-1

    The same bubble as GPipe, (p-1)/(m+p-1), but rank r holds at most p - r micro-batches'
    activations (<= p) instead of m: a backward frees one as each new forward takes one.
    """
    # BEGIN ANSWER ex07_one_f_one_b do: compute = list(
    # more: assigned("ex07_one_f_one_b").one_f_one_b(rank, p, m))
    warmup = min(p - rank - 1, m)
    compute = [Forward(i) for i in range(warmup)]
    for i in range(m - warmup):
        compute += [Forward(warmup + i), Backward(i)]
    compute += [Backward(i) for i in range(m - warmup, m)]
    # END ANSWER
    yield from with_comms(compute, rank, p, 1)


def _interleaved_order(p: int, m: int, v: int, backward: bool) -> list[tuple[int, int]]:
    """(mb, chunk) in Megatron's order: micro-batches in groups of p, each group through chunk 0,
    then chunk 1, ... (backward: the last chunk first)."""
    order = []
    for start in range(0, m, p):
        chunks = range(v - 1, -1, -1) if backward else range(v)
        order += [(mb, c) for c in chunks for mb in range(start, start + p)]
    return order


def interleaved(rank: int, p: int, m: int, v: int = 2):
    """Interleaved 1F1B (Megatron-LM): each rank holds v chunks (virtual stages) of the model.

    Roughly:
        fwd = [(mb, chunk) in groups of p micro-batches, chunk 0 then 1 ... v-1]
        bwd = the same with chunks v-1 ... 0
        warmup = min((p - rank - 1) * 2 + (v - 1) * p, m * v)
        forward fwd[:warmup]; then one forward one backward; then the remaining backwards

    A micro-batch crosses the ranks v times, each chunk 1/v of the work, so the warm-up and
    cool-down shrink v times: bubble (p-1)/(v*m + p-1) when p divides m, for v times the
    messages. Rank 0 holds the most activations: about p*v + p - 1 chunk-micro-batches.
    When p does not divide m, the schedule is built for m rounded up to a multiple of p and the
    phantom micro-batches are dropped: any order the full schedule allows, its part allows too,
    so it cannot deadlock.
    """
    padded = -(-m // p) * p
    fwd = _interleaved_order(p, padded, v, backward=False)
    bwd = _interleaved_order(p, padded, v, backward=True)
    total = padded * v
    warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
    compute = [Forward(*fwd[k]) for k in range(warmup)]
    for k in range(total - warmup):
        compute += [Forward(*fwd[warmup + k]), Backward(*bwd[k])]
    compute += [Backward(*bwd[k]) for k in range(total - warmup, total)]
    yield from with_comms([ins for ins in compute if ins.mb < m], rank, p, v)


def zb_h1(rank: int, p: int, m: int, v: int = 1):
    """ZB-H1 (zero bubble, Qi et al. 2023): split backward into B (input gradient, on the
    critical path) and W (weight gradient, needed by nobody downstream), and push W's into
    the cool-down where 1F1B idles.

    Roughly, with w = min(p - rank - 1, m) warm-up forwards (1F1B's):
        F 0 .. w-1
        for i in 0 .. m-w-1: F w+i; B i; and W i-rank once i >= rank
        for i in m-w .. m-1: B i; W next
        W the rest

    Rank r defers r W's, so it holds (p - r) + r = p micro-batches at most: 1F1B's peak memory.
    With equal F, B, W costs the bubble is (p-1)/(3m + p-1), a third of 1F1B's.
    """
    ahead = min(p - rank - 1, m)
    compute = [Forward(i) for i in range(ahead)]
    next_w = 0
    for i in range(m - ahead):
        compute += [Forward(ahead + i), BackwardInput(i)]
        if i >= rank:
            compute.append(BackwardWeight(next_w))
            next_w += 1
    for i in range(m - ahead, m):
        compute.append(BackwardInput(i))
        compute.append(BackwardWeight(next_w))
        next_w += 1
    compute += [BackwardWeight(i) for i in range(next_w, m)]
    yield from with_comms(compute, rank, p, 1)


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved, "zb-h1": zb_h1}


def check(name: str, p: int, m: int, v: int = 1) -> None:
    """Raise ValueError naming the bad value (the same words on every rank)."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {name!r}; choose one of {sorted(SCHEDULES)}")
    for what, value in (("pipeline size p", p), ("n_microbatches", m), ("virtual_stages", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{what} must be a positive int, got {value!r}")
    if v != 1 and name != "interleaved":
        raise ValueError(
            f"virtual_stages={v} needs schedule 'interleaved'; {name!r} runs one stage per rank"
        )


def instructions(name: str, rank: int, p: int, m: int, v: int = 1) -> list:
    """The instruction list of `rank` for schedule `name` (p ranks, m micro-batches, v chunks)."""
    check(name, p, m, v)
    if not 0 <= rank < p:
        raise ValueError(f"rank {rank} is out of range for a pipeline of {p} ranks")
    return list(SCHEDULES[name](rank, p, m, v))


def program(name: str, p: int, m: int, v: int = 1) -> list[list]:
    """Every rank's instruction list: the whole schedule as data."""
    return [instructions(name, r, p, m, v) for r in range(p)]
