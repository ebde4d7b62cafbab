"""Lesson 05: data parallelism (text: lessons/05_data_parallel.md).

    minipar lesson 05 -n 2                 # python -m minipar.course.lessons.l05_data_parallel
    minipar lesson 05 --break tied-twice   # a tied weight all-reduced twice, caught

One MLP, four ways to train it on p ranks: a naive all-reduce per parameter after backward, DDP's
buckets started during backward (overlap), ZeRO-1 (optimizer state sharded) and FSDP (everything
sharded). Each section prints its prediction (bytes from the formulas, times from the cost
model, memory from the ZeRO paper), then what the trace ledger and the clock measured.
"""

from __future__ import annotations

import statistics
from functools import partial

import minipar
from minipar import cost
from minipar.course import claims as C
from minipar.course.lessons import ddp_costs, planted, sharding_across_nodes
from minipar.course.lessons.mlp_steps import build, data, one_step, step_spread, widths
from minipar.course.lessons.page import Page, fmt_bytes, fmt_rate, fmt_time

K_ADAM = 8  # bytes of optimizer state per fp32 parameter: Adam's two moments


def claims() -> list[str]:
    """Numbers lessons/05_data_parallel.md states; tests/test_lessons.py checks the text."""
    psi = 7e9  # a 7B-parameter model
    return [
        f"{K_ADAM * psi / 1e9:.0f} GB",  # Adam state, DDP
        f"{K_ADAM * psi / 8 / 1e9:.0f} GB",  # ZeRO-1 on 8 ranks
        f"{16 * psi / 64 / 1e9:.2f} GB",  # FSDP on 64 ranks: (4+4+8) Psi / 64
        f"{2 * 7 / 8:.3g}",  # 2 (p-1)/p on 8 ranks
    ]


def ring_bytes(nbytes: int, p: int) -> float:
    return cost.traffic("all_reduce", "ring", nbytes, p).bytes_sent


def naive_all_reduce(model, p: int) -> None:
    """After backward, one blocking ring all-reduce per parameter (exercise ex05_naive_ddp)."""
    for param in model.parameters():
        minipar.all_reduce(param.grad, algorithm="ring")
        param.grad.div_(p)


def sync_section(page: Page) -> None:
    # here, not at the top of the file: torch loads only when used
    from minipar.parallel import DistributedDataParallel

    p, x, y = page.size, *data(page)
    model = build(page.quick)
    params = list(model.parameters())
    sizes = [4 * q.numel() for q in params]
    psi = sum(sizes)
    machine = page.machine()
    link = machine.collective  # a collective step's cost: the message + minipar's Python
    costs = ddp_costs.measure(page, model, x, y, link)
    model_s = ddp_costs.exposed(costs, sizes, p, link)
    page.prediction("gradient all-reduce, per parameter and bucketed")
    page.say(f"[dim]a collective step costs {fmt_time(link.alpha)} (of which minipar's Python "
             f"{fmt_time(machine.step_s)}): {machine.basis}. Measured at the start of this "
             f"lesson: a call on a gradient backward has just written adds "
             f"{fmt_time(costs.call_s)} (on a small tensor {fmt_time(costs.launch_s)}: what each "
             f"of DDP's launches pays), the progress "
             f"thread's hand-off {fmt_time(costs.handoff_s)}, a hook copying a gradient "
             f"{fmt_time(costs.hook_s)} a parameter, DDP's own work (a per-parameter DDP on a "
             f"group of one rank) {fmt_time(costs.own_s)} a parameter, the memory copy "
             f"{fmt_rate(machine.copy_Bps)}.[/]")  # fmt: skip
    ddps = {cap: DistributedDataParallel(build(page.quick), bucket_cap_mb=cap, algorithm="ring")
            for cap in (0, 25)}  # fmt: skip
    calls = {"naive": len(params), "per parameter": len(ddps[0].buckets) + 1,
             "one bucket": len(ddps[25].buckets) + 1}  # fmt: skip
    page.table(
        f"MLP {'-'.join(map(str, widths(page.quick)))}: {len(params)} tensors, "
        f"{fmt_bytes(psi)} of fp32 gradients, {p} ranks, ring",
        ["version", "all-reduces>", "bytes sent per rank>", "model: exposed>"],
        [
            (name, calls[name], fmt_bytes(ring_bytes(psi, p)), fmt_time(model_s[name]))
            for name in model_s
        ],  # fmt: skip
        caption="bytes: 2 (p-1)/p of the gradients either way; DDP adds its `used` all-reduce",
    )
    if p >= page.cores:
        page.say("[dim]No core is left for the progress thread while backward runs, so the "
                 "model overlaps nothing: per-parameter DDP pays its own work (hook, copies, "
                 "launch, hand-off, wait) on every tensor, and comes out slower than "
                 "naive.[/]")  # fmt: skip
    page.measurement("the trace ledger and the clock")
    with minipar.trace() as t:
        one_step(model, x, y, after=lambda: naive_all_reduce(model, p))
    naive_calls = len([c for c in t.calls if c.collective == "all_reduce"])
    page.check(naive_calls == len(params), "naive: one all-reduce per tensor")
    variants = {"naive": (model, lambda: naive_all_reduce(model, p)),
                "per parameter": (ddps[0], None), "one bucket": (ddps[25], None)}  # fmt: skip
    for cap, ddp in ddps.items():
        ledger_section(page, ddp, cap, sizes)
    compute = fastest_step(page, model, x, y)
    steps = {name: partial(fastest_step, page, net, x, y, after)
             for name, (net, after) in variants.items()}  # fmt: skip
    pairs = 3 if page.quick else 5
    paired = {name: page.alternate(steps[name], steps["naive"], pairs)
              for name in ("per parameter", "one bucket")}  # fmt: skip
    rows = [("compute only (no communication)", fmt_time(compute), "", "")]
    seen = {"naive": statistics.median(paired["one bucket"].b)}
    seen |= {name: pair.seconds[0] for name, pair in paired.items()}
    for name, step in seen.items():
        rows.append((name, fmt_time(step), fmt_time(step - compute), fmt_time(model_s[name])))
    page.table(
        f"one training step (the fastest of {STEP_REPS}, the median of the pairs)",
        ["version", "step>", "exposed comm>", "model: exposed>"],
        rows,
        caption="exposed = step - compute: the communication backward did not hide",
    )
    for name, pair in paired.items():
        want = (compute + model_s[name]) / (compute + model_s["naive"])
        page.ratio_claim(f"DDP {name} / naive step time", want, pair,
                         "the naive step (all-reduces after backward), alternated",
                         C.BANDWIDTH_BOUND, basis=machine.basis)  # fmt: skip
    bucket_note(page, len(params), model_s, seen, compute)


# steps a variant's time is the fastest of: as many as the costs that price it (ddp_costs), so
# the two see the same tail (a hand-off to the progress thread now and then waits for a core)
STEP_REPS = 10


def fastest_step(page: Page, net, x, y, after=None) -> float:
    """The fastest of STEP_REPS steps (forward, backward, after()), the slowest rank's time."""
    return step_spread(page, net, x, y, after=after, reps=STEP_REPS)[0]


def ledger_section(page: Page, ddp, cap: int, sizes: list[int]) -> None:
    """One DDP step under the trace: the ring's bytes against 2(p-1)/p of the gradients, and
    the gradients bitwise the same on every rank."""
    p, x, y = page.size, *data(page)
    with minipar.trace() as t:
        one_step(ddp, x, y)
    # "ring@shm": the buckets live in the node's shared window and are reduced in place;
    # the ledger counts what the peers read as the ring's messages (the same bytes)
    sent = sum(c.bytes_sent for c in t.calls if c.algorithm in ("ring", "ring@shm"))
    name = f"DDP, {'per parameter' if cap == 0 else '25 MB buckets'} (overlapped)"
    want = ring_bytes(sum(sizes), p) if cap else sum(ring_bytes(n, p) for n in sizes)
    busiest = max(page.gather(sent))  # the formula counts the busiest rank
    page.claim(f"{name}: the ledger shows 2(p-1)/p of the gradient bytes", want, busiest,
               "B", C.relative(0.01), "bytes")  # fmt: skip
    grads = [q.grad.numpy().tobytes() for q in ddp.parameters()]
    seen = page.gather(grads)
    page.check(all(s == seen[0] for s in seen), f"{name}: gradients bitwise identical")


def bucket_note(page: Page, tensors: int, model_s: dict, seen: dict, compute: float) -> None:
    """Why the bucket wins or not here: the calls it saves against the copies it adds."""
    exposed = {name: step - compute for name, step in seen.items()}
    faster = exposed["one bucket"] < exposed["naive"]
    page.say(
        f"One bucket {'beat' if faster else 'did not beat'} the naive sync here "
        f"({fmt_time(exposed['one bucket'])} against {fmt_time(exposed['naive'])} exposed). The "
        f"bucket saves {tensors - 1} calls, and pays for copying the gradients into the bucket, "
        "for DDP's hook on every parameter, the progress thread's hand-off and DDP's closing "
        f"`used` all-reduce; with {tensors} small tensors the model says "
        f"{fmt_time(model_s['naive'])} against {fmt_time(model_s['one bucket'])}. The saving "
        "grows with the number of tensors (a real model has hundreds) and, given a spare core, "
        "with the overlap with the backward's length."
    )


def memory_section(page: Page) -> None:
    import torch

    # here, not at the top of the file: torch loads only when used
    from minipar.parallel import FullyShardedDataParallel, ZeroRedundancyOptimizer

    p, x, y = page.size, *data(page)
    model = build(page.quick)
    n_params = sum(q.numel() for q in model.parameters())
    page.prediction("optimizer state and traffic, ZeRO-1 and FSDP (ZeRO-3)")
    page.table(
        f"AdamW on {n_params:,} fp32 parameters (Psi = {fmt_bytes(4 * n_params)}), {p} ranks",
        ["strategy", "optimizer state per rank>", "params+grads per rank>", "sent per rank>"],
        [
            (
                "DDP",
                fmt_bytes(K_ADAM * n_params),
                fmt_bytes(8 * n_params),
                fmt_bytes(ring_bytes(4 * n_params, p)),
            ),
            (
                "ZeRO-1",
                fmt_bytes(K_ADAM * n_params / p),
                fmt_bytes(8 * n_params),
                "+ the updated shards",
            ),
            (
                "FSDP",
                fmt_bytes(K_ADAM * n_params / p),
                fmt_bytes(8 * n_params / p),
                fmt_bytes(1.5 * ring_bytes(4 * n_params, p)),
            ),
        ],
        caption="ZeRO paper: K Psi / N_d for the state; FSDP gathers twice, reduce-scatters once",
    )
    page.measurement("what each rank holds, and what FSDP moved")
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    ((model(x) - y) ** 2).mean().backward()
    opt.step()
    zero_state = opt.state_bytes() - 4 * sum(1 for r in opt.owner if r == page.rank)  # no steps
    fsdp = FullyShardedDataParallel(build(page.quick))
    fopt = torch.optim.AdamW(fsdp.parameters(), lr=1e-3)
    xg = x.clone().requires_grad_(True)  # so backward needs every weight (see the text)
    with minipar.trace() as t:
        ((fsdp(xg) - y) ** 2).mean().backward()
    fopt.step()
    fsdp_state = sum(
        v.numel() * v.element_size() for s in fopt.state.values() for v in s.values() if v.dim() > 0
    )
    shards = sum(q.numel() for q in fsdp.parameters())
    rows = [
        (
            "ZeRO-1 optimizer state",
            fmt_bytes(max(page.gather(zero_state))),
            fmt_bytes(K_ADAM * n_params / p),
        ),
        (
            "FSDP optimizer state",
            fmt_bytes(max(page.gather(fsdp_state))),
            fmt_bytes(K_ADAM * n_params / p),
        ),
        ("FSDP parameters held", fmt_bytes(4 * shards), fmt_bytes(4 * n_params / p)),
        (
            "FSDP bytes sent",
            fmt_bytes(t.bytes_sent()),
            fmt_bytes(1.5 * ring_bytes(4 * n_params, p)),
        ),
    ]
    page.table(
        f"rank {page.rank} (state: the largest over ranks)",
        ["what", "measured>", "predicted>"],
        rows,
    )
    biggest = max(q.numel() for q in model.parameters())
    page.check(
        max(page.gather(zero_state)) <= K_ADAM * (n_params / p + biggest),
        "ZeRO-1 state per rank within one parameter of K Psi / N_d",
    )
    page.check(
        t.bytes_sent() == 3 * sum(u.block * 4 * (p - 1) for u in fsdp.units),
        "FSDP: all-gather twice + reduce-scatter, 1.5x DDP's bytes (padding included)",
    )


def lab_tied_twice(page: Page) -> None:
    import torch

    # here, not at the top of the file: torch loads only when used
    from minipar.parallel.data.ddp import DistributedDataParallel

    p = page.size
    page.section("Break-it lab: a tied weight all-reduced twice")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32, bias=False))
    model[1].weight = model[0].weight  # the classic tie: input embedding = output projection
    tokens = torch.randint(0, 32, (8, 4), generator=torch.Generator().manual_seed(page.rank))
    psi = 4 * sum(q.numel() for q in model.parameters())

    def grads_with(sync):
        for q in model.parameters():
            q.grad = None
        torch.nn.functional.cross_entropy(
            model(tokens).reshape(-1, 32), tokens.reshape(-1)
        ).backward()
        with minipar.trace() as t:
            sync()
        return model[0].weight.grad.clone(), t.bytes_sent()

    bad, bad_bytes = grads_with(lambda: planted.all_reduce_gradients_every_name(model))
    good, good_bytes = grads_with(lambda: naive_all_reduce(model, p))
    page.table(
        "tied weight: what moved and what came out",
        ["sync", "sent per rank>", "formula 2(p-1)/p Psi>", "|grad|>"],
        [
            (
                "planted: every name",
                fmt_bytes(bad_bytes),
                fmt_bytes(ring_bytes(psi, p)),
                f"{bad.norm():.4f}",
            ),
            (
                "each Parameter once",
                fmt_bytes(good_bytes),
                fmt_bytes(ring_bytes(psi, p)),
                f"{good.norm():.4f}",
            ),
        ],
    )
    if p > 1:
        page.check(
            bad_bytes > ring_bytes(psi, p) == good_bytes,
            "the ledger check catches it: the planted sync moves more than 2(p-1)/p Psi",
        )
        page.check(
            not torch.allclose(bad, good),
            "and its gradient is wrong (p times the average for the tied weight)",
        )
    ddp = DistributedDataParallel(model, bucket_cap_mb=0, algorithm="ring")
    page.check(len(ddp.buckets) == 1, "DDP lists the tied weight once (one bucket slot)")


def main(argv=None) -> int:
    page = Page("05", "Data parallelism: DDP, ZeRO, FSDP", ("tied-twice",), argv=argv)
    if page.lab:
        lab_tied_twice(page)
    else:
        sync_section(page)
        memory_section(page)
        sharding_across_nodes.nodes_section(page)
        page.try_this(
            [
                "Write the naive and the bucketed sync yourself: exercises/ex05_naive_ddp.py, "
                "ex05_bucketed_ddp.py, then `minipar grade 05`.",
                "The ZeRO-1 step: exercises/ex05_zero1_step.py.",
                "minipar bench ddp -n 2: minipar DDP against torch DDP on a 10M-parameter MLP.",
                "minipar lesson 05 --break tied-twice: why does the ledger see it first?",
                "minipar lesson 05 --nodes 2 --link 200mbit (as root): full against hybrid "
                "sharding across a slow link; at 2gbit, does hybrid still win?",
            ]
        )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
