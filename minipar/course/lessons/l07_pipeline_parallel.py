"""Lesson 07: pipeline parallelism (text: lessons/07_pipeline_parallel.md).

    minipar lesson 07 -n 4                  # python -m minipar.course.lessons.l07_pipeline_parallel
    minipar lesson 07 --break dp-warmup     # DP x 1F1B with a stage that never syncs, caught

The model is cut into one stage per rank; micro-batches flow through. First the verifier
predicts each schedule's bubble and peak activations with no communication at all; then each
schedule runs on real ranks with stages that sleep a fixed time per forward, input-gradient and
weight-gradient pass (so the timing means something even on a shared 2-core machine), and the
measured timeline is drawn. Last, a real model's loss and gradients are checked against one
process.
"""

from __future__ import annotations

import time
from functools import partial

import minipar
from minipar.course import claims as C
from minipar.course.lessons import planted
from minipar.course.lessons.l01_hierarchy import ping_pong
from minipar.course.lessons.page import Page, fmt_bytes
from minipar.parallel.pipeline import Pipeline, Timeline, split
from minipar.parallel.pipeline import schedules as S
from minipar.parallel.pipeline import verify as V

M = 8  # micro-batches
RUNS = [  # (label, schedule, micro-batches, virtual stages)
    ("naive (one batch)", "gpipe", 1, 1),
    ("GPipe", "gpipe", M, 1),
    ("1F1B", "1f1b", M, 1),
    ("interleaved, v=2", "interleaved", M, 2),
    ("zero bubble H1", "zb-h1", M, 1),
]


def claims() -> list[str]:
    """Numbers lessons/07_pipeline_parallel.md states (for p = 4); tests/test_lessons.py checks."""
    return [f"{V.predicted_bubble(s, 4, m, v):.1%}" for _, s, m, v in RUNS]


# -- prediction ------------------------------------------------------------------------------


def predict_section(page: Page) -> dict:
    p = page.size
    page.prediction(f"bubble and memory on {p} ranks (the verifier, no messages sent)")
    page.say("Costs: forward 1, backward 2 (zero bubble: input grad 1, weight grad 1) per stage.")
    rows, predicted = [], {}
    for label, name, m, v in RUNS:
        report = V.verify(S.program(name, p, m, v))
        predicted[label] = report
        rows.append((label, m, f"{V.predicted_bubble(name, p, m, v):.1%}",
                     f"{report.bubble_fraction:.1%}", max(report.peak_in_flight)))  # fmt: skip
    caption = "peak activations: most micro-batches (x chunks) one rank holds at once"
    columns = ["schedule", "m>", "formula>", "verifier>", "peak activations>"]
    page.table(None, columns, rows, caption=caption)
    return predicted


# -- measurement -----------------------------------------------------------------------------


def sleep_stage(t: float, width: int):
    """A stage with equal forward, input-gradient and weight-gradient costs: sleeps t each."""
    import torch
    import torch.nn as nn

    class Sleep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fwd, bwd):
            ctx.bwd = bwd
            time.sleep(fwd)
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            time.sleep(ctx.bwd)
            return grad, None, None

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(width))

        def forward(self, x):
            return Sleep.apply(x, t, t) * Sleep.apply(self.w, 0.0, t)

    return Stage()


def run_schedule(page: Page, name: str, m: int, v: int, t: float):
    import torch

    width = 256
    chunks = [sleep_stage(t, width) for _ in range(v)]
    pipe = Pipeline(chunks if v > 1 else chunks[0], n_microbatches=m, schedule=name,
                    loss_fn=lambda out, y: (out - y).pow(2).mean(), virtual_stages=v)  # fmt: skip
    # the input asks for its gradient, so the first stage's backward sleeps its input-gradient
    # share too: every stage equal, as the formula assumes (else stage 0's B would cost nothing)
    pipe.step(torch.ones(4 * m, width, requires_grad=True), torch.zeros(4 * m, width))
    memory = page.gather((pipe.peak_in_flight, pipe.peak_activation_bytes))
    per_rank = page.gather(pipe.events)
    return Timeline.from_events(per_rank), memory, per_rank


def message_latency(page: Page) -> float:
    """One small message's one-way time between two stages here (ping-pong of 8 B, the best of
    20): the latency the replay charges each send."""
    return page.gather(ping_pong(page.comm, 8, 20))[0] if page.size > 1 else 0.0


def replay_cause(name: str, m: int, v: int, per_rank, latency: float, measured: float) -> str:
    """The replay diagnosis (lessons/07_pipeline_parallel.md, section 7): the same schedule
    through the verifier with each instruction's measured time and the measured latency. When
    it lands within 0.04 of the measurement, the stages' unequal times and the messages explain
    the gap to the formula; when not, the runtime added the rest, and there is no cause."""
    took = {(r, ins): e - s for r, events in enumerate(per_rank) for ins, s, e in events}
    program = S.program(name, len(per_rank), m, v)
    replay = V.verify(program, costs=lambda r, ins: took[r, ins], latency=latency)
    if abs(replay.bubble_fraction - measured) > 0.04:
        return ""
    spans = [e - s for events in per_rank for _, s, e in events]
    return (
        f"the replay with the measured pass times ({min(spans) * 1e3:.1f}-"
        f"{max(spans) * 1e3:.1f} ms, not the formula's equal ones) and a {latency * 1e6:.0f} us "
        f"message latency gives {replay.bubble_fraction:.1%}: unequal stages and messages"
    )


def measure_section(page: Page, predicted: dict) -> None:
    t = 0.004 if page.quick else 0.03  # quick: too short to beat a busy machine's noise
    p = page.size
    page.measurement(f"each schedule on {p} ranks, stages that sleep {t * 1e3:.0f} ms per pass")
    rows, bubbles = [], []
    latency = message_latency(page)
    for label, name, m, v in RUNS:
        timeline, memory, per_rank = run_schedule(page, name, m, v, t)
        page.say(f"\n[bold]{label}[/] (m={m})")
        timeline.print(page.console, width=min(70, page.console.width - 20))  # + bubble NN%
        formula = V.predicted_bubble(name, p, m, v)
        peak = max(count for count, _ in memory)
        rows.append((label, f"{formula:.1%}", f"{timeline.bubble_fraction:.1%}", peak,
                     fmt_bytes(max(nbytes for _, nbytes in memory))))  # fmt: skip
        if name == "gpipe" and m == M:
            page.check(all(c == M for c, _ in memory), f"GPipe holds all {M} micro-batches")
        if name == "1f1b":
            page.check(peak <= p, f"1F1B holds at most p = {p} micro-batches")
        page.claim("peak matches the verifier", max(predicted[label].peak_in_flight), peak,
                   "micro-batches", C.EXACT, "steps")  # fmt: skip
        bubble = timeline.bubble_fraction
        bubbles.append((formula, bubble))
        page.claim(f"{label}: measured bubble within 0.1 of the formula", formula, bubble,
                   "fraction", C.absolute(0.1), bound=(0.0, 1.0), basis="formula (equal stages)",
                   reference=ONE_TIMELINE,
                   causes=[replay_cause(name, m, v, per_rank, latency, bubble)])  # fmt: skip
    page.table("Bubble and memory, measured", ["schedule", "formula>", "measured>", "peak>",
                                               "peak bytes>"], rows)  # fmt: skip
    page.claim("every measured bubble is at or above its formula (messages cost time)", True,
               all(b >= f - 0.01 for f, b in bubbles), reference=ONE_TIMELINE,
               tolerance=C.EXACT, basis="formula (no messages)")  # fmt: skip
    step_ratio_section(page, predicted, t)


ONE_TIMELINE = "the same step's makespan (idle / makespan on one timeline)"


def step_ratio_section(page: Page, predicted: dict, t: float) -> None:
    """1F1B against GPipe on the same stages and micro-batches, alternated step by step: their
    step times' ratio against the verifier's makespans (the same bubble, so about 1)."""
    import torch

    width = 256
    loss = lambda out, y: (out - y).pow(2).mean()  # noqa: E731
    pipes = {label: Pipeline(sleep_stage(t, width), n_microbatches=m, schedule=name,
                             loss_fn=loss)
             for label, name, m, v in RUNS if label in ("1F1B", "GPipe")}  # fmt: skip
    x, y = torch.ones(4 * M, width), torch.zeros(4 * M, width)

    def step(pipe) -> float:
        page.comm.barrier()
        t0 = time.perf_counter()
        pipe.step(x, y)
        return max(page.gather(time.perf_counter() - t0))

    for pipe in pipes.values():
        step(pipe)  # warm up
    paired = page.alternate(partial(step, pipes["1F1B"]), partial(step, pipes["GPipe"]),
                            3 if page.quick else 5)  # fmt: skip
    want = predicted["1F1B"].makespan / predicted["GPipe"].makespan
    page.ratio_claim(f"1F1B / GPipe step time (m = {M})", want, paired,
                     "GPipe's step on the same stages", C.relative(0.15),
                     basis="the verifier's makespans (equal stages, no messages)")  # fmt: skip


def correctness_section(page: Page) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    page.measurement("a real model: 1F1B's loss and gradients against one process")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(page.size)])
    x, y = torch.randn(32, 16), torch.randn(32, 16)
    pipe = Pipeline(split(model, page.size)[page.rank], n_microbatches=4, loss_fn=F.mse_loss)
    pipe.step(x, y)
    mine = [q.grad.clone() for q in pipe.parameters()]
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    error = max((a - q.grad).abs().max().item() for a, q in zip(mine, pipe.parameters()))
    worst = max(page.gather(error))
    page.say(f"largest gradient difference on any rank: {worst:.2e}")
    page.check(worst < 1e-5, "every stage's gradients equal one full-batch backward")


# -- the break-it lab ------------------------------------------------------------------------


def lab_dp_warmup(page: Page) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    page.section("Break-it lab: DP x 1F1B, the gradient all-reduce started in the cool-down")
    if page.size != 4:
        page.check(False, "this lab needs 4 ranks: 2 pipelines of 2 stages")
        return
    groups = [minipar.new_group(r) for r in ([0, 1], [2, 3], [0, 2], [1, 3])]
    pp, dp = groups[page.rank // 2], groups[2 + page.rank % 2]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    g = torch.Generator().manual_seed(1 + page.rank // 2)  # each replica its own data
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 8, generator=g)
    pipe = Pipeline(split(model, 2)[pp.rank], group=pp, n_microbatches=4, loss_fn=F.mse_loss)

    def sync():
        for q in pipe.parameters():
            minipar.all_reduce(q.grad, group=dp)
            q.grad /= dp.size

    pipe.step(x, y, on_instruction=planted.dp_sync_in_cooldown(pipe, sync))
    flat = torch.cat([q.grad.flatten() for q in pipe.parameters()])
    replicas = dp.allgather_object(flat)
    same = bool(torch.equal(replicas[0], replicas[1]))
    seen = page.gather((pp.rank, same))
    page.table(None, ["rank", "stage", "warm-up", "replicas' gradients agree"],
               [(r, s, 2 - s - 1, "yes" if ok else "[red]NO[/]") for r, (s, ok) in
                enumerate(seen)])  # fmt: skip
    page.check(not all(ok for _, ok in seen),
               "the check that DP replicas hold identical gradients after the step catches it: "
               "the last stage (empty warm-up) never synchronised")  # fmt: skip


def main(argv=None) -> int:
    page = Page("07", "Pipeline parallelism", ("dp-warmup",), argv=argv, min_ranks=2)
    if page.enough and page.lab:
        lab_dp_warmup(page)
    elif page.enough:
        predicted = predict_section(page)
        measure_section(page, predicted)
        correctness_section(page)
        page.try_this(
            [
                "minipar bench pp: every schedule's step time beside torch.distributed.pipelining.",
                "Write the 1F1B generator yourself: exercises/ex07_one_f_one_b.py, then "
                "`minipar grade 07`.",
                "In predict_section, give backward the cost 3: which schedule gains most?",
                "Run with -n 2: the bubble formulas still hold; which schedule still pays?",
                "minipar lesson 07 --break dp-warmup: which stage never synchronised, and why?",
            ]
        )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
