"""Lesson 01: why parallelism, and the hierarchy of memory and links (lessons/01_hierarchy.md).

    minipar lesson 01            # python -m minipar.course.lessons.l01_hierarchy on 2 ranks

Predicts, with arithmetic and the cost model: how many bytes training a 7B and a 70B model holds
(it does not fit one GPU), how fast each level of the hierarchy moves them (HBM, NVLink,
PCIe, InfiniBand), and how long one all-reduce of the gradients takes on each link. Then
measures the same two things on this machine: memory copy bandwidth (the "HBM" here) against
rank-to-rank message bandwidth and latency (the "link" here).
"""

from __future__ import annotations

import math
import time

import numpy as np

import minipar
from minipar import cost
from minipar.course import claims as C
from minipar.course.lessons import hardware, single_copy
from minipar.course.lessons.page import Page, fmt_bytes, fmt_rate, fmt_time
from minipar.course.machine import link_bits
from minipar.launcher.cluster import link as links
from minipar.models.config import GPTConfig, RunSpec

# Mixed-precision training with Adam keeps, per parameter (the ZeRO paper's accounting):
BYTES_PER_PARAM = {
    "weights (bf16)": 2,
    "gradients (bf16)": 2,
    "fp32 master weights": 4,
    "Adam first moment m (fp32)": 4,
    "Adam second moment v (fp32)": 4,
}
MODELS = {"7B": 7e9, "70B": 70e9}
GRADIENT_BYTES = 2  # bf16 gradients are what data parallelism all-reduces


def training_bytes(params: float) -> float:
    """Bytes of weights, gradients and optimizer state (no activations)."""
    return params * sum(BYTES_PER_PARAM.values())


def gpus_needed(params: float, gpu: hardware.GPU) -> int:
    """The fewest GPUs whose memory together holds the training state (states split evenly,
    as ZeRO-3/FSDP does; activations and fragmentation not counted, so a lower bound)."""
    return math.ceil(training_bytes(params) / gpu.hbm_bytes)


def allreduce_gradients(params: float, gpus: int, link_name: str) -> float:
    """Predicted seconds for one ring all-reduce of the bf16 gradients over `gpus` GPUs."""
    return cost.predict(
        "all_reduce", "ring", params * GRADIENT_BYTES, gpus, hardware.link(link_name)
    )


def hierarchy_rows():
    """(level, example, bandwidth each way, fraction of HBM, time to move a 7B model's bf16
    gradients once) per level, fastest first."""
    levels = [
        ("HBM (on the GPU)", "B200 HBM3e", "hbm3e"),
        ("NVLink (in the node)", "NVLink 5 + NVSwitch", "nvlink5"),
        ("PCIe (GPU to host/NIC)", "PCIe 5.0 x16", "pcie5"),
        ("InfiniBand (between nodes)", "NDR 400 Gb/s", "ib_ndr"),
    ]
    grads = MODELS["7B"] * GRADIENT_BYTES
    hbm = hardware.rate(hardware.link("hbm3e"))
    rows = []
    for level, example, name in levels:
        r = hardware.rate(hardware.link(name))
        rows.append((level, example, fmt_rate(r), f"{r / hbm:.3g}", fmt_time(grads / r)))
    return rows


def nvlink_to_hbm() -> float:
    """The seed's "about a quarter": NVLink 5's 1.8 TB/s (total) over HBM's 8 TB/s."""
    return hardware.B200.nvlink_total / hardware.B200.hbm_rate


def claims() -> list[str]:
    """Numbers lessons/01_hierarchy.md states; tests/test_lessons.py checks each is in the text."""
    seven, seventy = MODELS["7B"], MODELS["70B"]
    return [
        f"{sum(BYTES_PER_PARAM.values())} bytes per parameter",
        f"{training_bytes(seven) / 1e9:.0f} GB",
        f"{training_bytes(seventy) / 1e9:.0f} GB",
        f"{gpus_needed(seven, hardware.GPUS[0])} H100s",
        f"{gpus_needed(seventy, hardware.B200)} B200s",
        f"{gpus_needed(seventy, hardware.GPUS[0])} H100s",
        f"{nvlink_to_hbm():.3g}",
        fmt_rate(hardware.rate(hardware.link("nvlink5"))),
        fmt_time(allreduce_gradients(seven, 8, "nvlink5")),
        fmt_time(allreduce_gradients(seven, 8, "ib_ndr")),
        fmt_time(seven * GRADIENT_BYTES / hardware.rate(hardware.link("hbm3e"))),
        *(f"{gpu.hbm_bytes / 1e9:.0f} GB" for gpu in hardware.GPUS),
        fmt_rate(hardware.B200.nvlink_total),
        fmt_rate(hardware.B200.hbm_rate),
        *(fmt_rate(hardware.rate(hardware.link(name))) for name in ("pcie5", "ib_ndr")),
        f"{slower('nvlink5'):.2g} times",
        f"{slower('ib_ndr'):.0f} times",
    ]


def slower(name: str) -> float:
    """How many times longer a transfer takes over link `name` than at HBM3e speed."""
    return hardware.rate(hardware.link("hbm3e")) / hardware.rate(hardware.link(name))


# -- the measurements on this machine ---------------------------------------------------------


def ping_pong(comm, nbytes: int, reps: int, peer: int = 1) -> float:
    """Best one-way time of an nbytes message between rank 0 and `peer` (half a round trip)."""
    buf = np.ones(max(nbytes, 1), dtype=np.uint8)  # its pages touched: no page faults timed
    best = math.inf
    for _ in range(reps):
        if comm.rank == 0:
            t0 = time.perf_counter()
            comm.send(buf, peer)
            comm.recv(buf, peer)
            best = min(best, (time.perf_counter() - t0) / 2)
        elif comm.rank == peer:
            comm.recv(buf, 0)
            comm.send(buf, 0)
    return best


def peers(node_of) -> tuple[int | None, int | None]:
    """(a rank on rank 0's node, a rank on another node), None where there is none."""
    inside = next((r for r in range(1, len(node_of)) if node_of[r] == node_of[0]), None)
    across = next((r for r in range(1, len(node_of)) if node_of[r] != node_of[0]), None)
    return inside, across


def nodes_section(page: Page) -> None:
    """On emulated (or real) nodes: the link inside a node and the one between nodes, measured
    side by side, their ratio beside NVLink's to InfiniBand's."""
    inside, across = peers(minipar.node_map())
    if inside is None or across is None:
        page.say("(Run `minipar lesson 01 --nodes 2` as root to measure a link between nodes.)")
        return
    nbytes = (16 if page.quick else 64) << 20
    reps = 3 if page.quick else 5
    nv, ib = hardware.link("nvlink5"), hardware.link("ib_ndr")
    page.prediction("NVLink inside a node against InfiniBand between nodes (hardware table)")
    page.table(None, ["link", "latency>", "bandwidth>"], [
        ("NVLink 5 (inside)", fmt_time(nv.alpha), fmt_rate(1 / nv.beta)),
        ("InfiniBand NDR (between)", fmt_time(ib.alpha), fmt_rate(1 / ib.beta)),
        ("inside / between", "", f"{ib.beta / nv.beta:.3g}x"),
    ])  # fmt: skip
    bits = link_bits()
    page.say(f"Here the nodes are joined by an emulated link of {links.describe(bits)} "
             "(`--link`): a message between nodes can go no faster than that.")  # fmt: skip
    small = {name: page.gather(ping_pong(page.comm, 8, 20 if page.quick else 100, peer))[0]
             for name, peer in (("inside", inside), ("between", across))}  # fmt: skip
    crossed = page.alternate(
        lambda: page.gather(ping_pong(page.comm, nbytes, reps, across))[0],
        lambda: page.gather(ping_pong(page.comm, nbytes, reps, inside))[0],
        3 if page.quick else 5,
    )
    times = {"inside": (small["inside"], crossed.seconds[1]),
             "between": (small["between"], crossed.seconds[0])}  # fmt: skip
    page.measurement(f"rank 0 with rank {inside} (its node) and rank {across} (another node)")
    page.table(None, ["link", "latency (8 B)>", f"bandwidth ({fmt_bytes(nbytes)})>"], [
        (f"inside a node (rank 0 - {inside})", fmt_time(times["inside"][0]),
         fmt_rate(nbytes / times["inside"][1])),
        (f"between nodes (rank 0 - {across})", fmt_time(times["between"][0]),
         fmt_rate(nbytes / times["between"][1])),
        ("inside / between", "", f"{times['between'][1] / times['inside'][1]:.3g}x"),
    ])  # fmt: skip
    if bits:
        page.claim(f"bandwidth between nodes at {fmt_bytes(nbytes)}: the link's rate", bits / 8,
                   nbytes / times["between"][1], "B/s", C.BANDWIDTH_BOUND,
                   bound=(0, bits / 8 * 1.1), basis="--link",
                   causes=["TCP's headers and window on the emulated link"])  # fmt: skip
    page.ratio_claim(
        f"the link between nodes is the slower one at {fmt_bytes(nbytes)} (time ratio)",
        1.0,
        crossed,
        f"the same message inside a node (rank 0 - {inside}), alternated",
        C.at_least(),
    )
    page.say(
        "The link between nodes is the slow one for bandwidth: keep the heavy traffic inside a "
        "node (tensor parallelism), and send across nodes only what must cross (lessons 04, 08)."
    )
    if times["between"][0] < times["inside"][0]:
        page.say(
            f"[dim]For 8 B the order flips here ({fmt_time(times['between'][0])} between, "
            f"{fmt_time(times['inside'][0])} inside): tc shapes the rate, not the latency, and "
            "TCP between two namespaces of one kernel is a few microseconds, while inside a "
            "node MPI's shared memory waits on a peer that shares the cores with the other "
            "ranks. On real nodes the cable adds microseconds of its own.[/]"
        )


def memory_section(page: Page) -> None:
    page.prediction("the bytes of training a model, against one GPU's memory")
    rows = []
    for part, b in BYTES_PER_PARAM.items():
        rows.append((part, b, *(f"{p * b / 1e9:.0f} GB" for p in MODELS.values())))
    rows.append(
        (
            "total",
            sum(BYTES_PER_PARAM.values()),
            *(f"{training_bytes(p) / 1e9:.0f} GB" for p in MODELS.values()),
        )
    )
    page.table(
        "Training state (activations not counted)",
        ["what", "bytes/param>", *(f"{m}>" for m in MODELS)],
        rows,
        caption="GB here are 10^9 bytes, as GPU memory is sold",
    )
    rows = []
    for gpu in hardware.GPUS:
        cells = []
        for p in MODELS.values():
            need = gpus_needed(p, gpu)
            cells.append("fits" if need == 1 else f"needs >= {need} GPUs")
        rows.append((gpu.name, f"{gpu.hbm_bytes / 1e9:.0f} GB", *cells))
    page.table("One GPU's HBM", ["GPU", "HBM>", *MODELS], rows)


def measured_state(dtype: str = "bf16") -> dict:
    """One AdamW step of a small GPT under minipar train's `dtype` policy, and the state it
    left per parameter (minipar.models.state_bytes)."""
    # here, not at the top of the file: torch loads only when used
    from minipar.models import precision, state_bytes, training

    model = GPTConfig(seq_len=16, hidden=32, n_layers=2, n_heads=4)
    spec = RunSpec(steps=1, batch_size=2, model=model, dtype=dtype)
    _, gpt, opt = training.train_dense(spec)
    return state_bytes.state_bytes(list(gpt.parameters()), opt, precision.dtype_of(dtype))


def state_section(page: Page) -> None:
    page.measurement("one step of minipar train --dtype bf16, on this rank")
    held = measured_state("bf16")
    predicted = dict(zip(("weights", "grads", "master", "m", "v"), BYTES_PER_PARAM.values()))
    rows = [(k, predicted[k], f"{held[k]:.2f}") for k in predicted]
    rows.append(("total", sum(predicted.values()), f"{held['total']:.2f}"))
    rows.append(("bf16 copies while a forward runs", "-", f"{held['compute_copies']:.2f}"))
    page.table("Bytes per parameter", ["what", "table>", "measured>"], rows)
    page.say(
        "The same 16 bytes, split another way: minipar's bf16 policy keeps the fp32 master "
        "weights as the parameters themselves (no bf16 copy between steps), so the gradients "
        "are fp32 too; autocast makes the bf16 weights for each forward and drops them after."
    )
    page.check(abs(held["total"] - 16) < 1e-9, "the training state is 16 bytes per parameter")


def hierarchy_section(page: Page) -> None:
    page.prediction("the hierarchy: how fast each level moves bytes")
    page.table(
        "Moving a 7B model's bf16 gradients (14 GB) once, per level",
        ["level", "example", "bandwidth each way>", "x HBM>", "time>"],
        hierarchy_rows(),
    )
    page.say(
        f"NVLink 5 / HBM (both as the seed quotes them, 1.8 TB/s and 8 TB/s): "
        f"{nvlink_to_hbm():.3g}, about a quarter."
    )
    rows = []
    for gpus, name in ((8, "nvlink5"), (8, "ib_ndr"), (64, "ib_ndr")):
        t = allreduce_gradients(MODELS["7B"], gpus, name)
        rows.append((gpus, name, fmt_time(t)))
    page.table(
        "cost.predict: ring all-reduce of 7B bf16 gradients",
        ["GPUs>", "link", "predicted>"],
        rows,
    )


def copy_time(src, dst, reps: int) -> float:
    """The fastest of reps numpy copies of src into dst on this rank: what the same bytes cost
    moved through memory once."""
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best


def cores_apart(page: Page, src, dst, reps: int, together: float) -> str:
    """A measured cause, or "": whether ranks 0 and 1 share no cache or memory path now (a
    hypervisor may place a VM's two cores apart, and move them): a copy on both at once as fast
    as on rank 0 alone (collective)."""
    alone = page.gather(copy_time(src, dst, reps) if page.rank == 0 else 0.0)[0]  # others wait
    # the two copies contended (1.3-2.1x here; 1.0-1.2x with the cores apart): a shared path
    if together > 1.5 * alone:
        return ""
    return (f"ranks 0 and 1 ran on cores that share no cache now: a copy on both at once took "
            f"{fmt_time(together)}, on rank 0 alone {fmt_time(alone)}, so the message's "
            "handshakes and bytes cross between the two cores' caches")  # fmt: skip


def machine_section(page: Page) -> None:
    machine = page.machine()
    link = machine.message
    nbytes = (16 if page.quick else 64) << 20
    reps, pairs = (3, 5) if page.quick else (5, 9)
    copies = single_copy.copies(page.comm)  # 1 where the kernel lets MPI read the peer's pages
    how = (
        "one copy: MPICH's cross-memory attach, the receiver reading the sender's pages "
        "(process_vm_readv worked between ranks 0 and 1 just now)"
        if copies == 1
        else "two copies: no cross-memory attach between ranks 0 and 1 here, so the bytes go "
        "through MPICH's shared cells, copied in by the sender and out by the receiver"
    )
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    np.copyto(dst, src)  # its pages touched once, so the copy times memory, not page faults
    predicted, basis = copies, "copies: process_vm_readv tried now"
    crossing = single_copy.read_seconds(page.comm, nbytes, reps) if copies == 1 else None
    apart = ""  # a measured cause where the two cores share no cache
    if crossing is not None:  # that one copy between these two cores, against a local one
        local = page.gather(copy_time(src, dst, reps))[0]  # every rank at once, as measured
        predicted = crossing / local
        apart = cores_apart(page, src, dst, reps, local)
        basis = (f"one copy out of the other rank's memory (process_vm_readv, timed now: "
                 f"{fmt_time(crossing)}) / one local copy ({fmt_time(local)}, "
                 "timed now)")  # fmt: skip
    page.prediction("this machine")
    page.say(f"[dim]message latency: {machine.basis}[/]")
    page.table(
        None,
        ["quantity", "predicted>"],
        [
            ("message latency (alpha)", fmt_time(link.alpha)),
            (f"one-way time of {fmt_bytes(nbytes)} / one memory copy of it", f"{predicted:.3g}x"),
        ],
    )
    page.say(f"[dim]A large message inside a node here: {how}.[/]")
    if crossing is not None:
        page.say(f"[dim]That one copy crosses from one core to the other: timed now it takes "
                 f"{predicted:.2g}x a local copy (more where the two cores share no cache, "
                 f"so the sender's fresh bytes come from memory).[/]")  # fmt: skip
    latency = page.gather(ping_pong(page.comm, 8, 50 if page.quick else 200))[0]
    moved = page.alternate(
        lambda: page.gather(ping_pong(page.comm, nbytes, reps))[0],
        lambda: page.gather(copy_time(src, dst, reps))[0],
        pairs,
    )
    big, copy = moved.seconds
    page.measurement("this machine")
    page.table(
        None,
        ["quantity", "measured>"],
        [
            ("memory copy bandwidth (every rank at once)", fmt_rate(machine.copy_Bps)),
            ("one message's latency (8 B, ping-pong / 2)", fmt_time(latency)),
            (f"one-way time of {fmt_bytes(nbytes)} (median of {pairs})", fmt_time(big)),
            (f"one copy of {fmt_bytes(nbytes)} on rank 0, alternated with it", fmt_time(copy)),
            ("rank-to-rank bandwidth", fmt_rate(nbytes / big)),
        ],
    )
    page.claim("one message's latency (8 B)", link.alpha + 8 * link.beta, latency, "s",
               C.LATENCY_BOUND, basis=machine.basis)  # fmt: skip
    page.ratio_claim(f"one-way time of {fmt_bytes(nbytes)} / one memory copy of it", predicted,
                     moved, f"one numpy copy of {fmt_bytes(nbytes)} on rank 0",
                     C.LATENCY_BOUND, basis=basis, causes=[apart])  # fmt: skip
    page.say(
        f"On a B200 the link/memory ratio is {nvlink_to_hbm():.3g}. Here both 'links' are memory: "
        "a message is one or two copies through shared memory plus Python's overhead."
    )
    page.check(latency > 0 and big > latency, "a big message takes longer than a tiny one")


def main(argv=None) -> int:
    page = Page("01", "Why parallelism, and the hierarchy", min_ranks=2, argv=argv)
    if page.enough:
        memory_section(page)
        state_section(page)
        hierarchy_section(page)
        machine_section(page)
        nodes_section(page)
        page.try_this(
            [
                "Change BYTES_PER_PARAM for pure bf16 training with 8-bit Adam: does 70B fit "
                "on 8 B200s?",
                "minipar lesson 01 -n 4: does the latency grow when ranks share cores?",
                "Predict the all-reduce time for 405B parameters on 8 GPUs over NVLink 5, "
                "then over InfiniBand (allreduce_gradients).",
            ]
        )
    return page.finish()


if __name__ == "__main__":
    raise SystemExit(main())
