"""A merged trace (trace/chrome_trace.py) drawn as a PNG: the timeline Perfetto shows, on paper.

    save_png("trace.json", "trace.png")      # needs matplotlib (the plot extra)

One row per rank, split in a lane per thread (the main thread on top; the progress thread, which
runs the async collectives, below it). Compute spans (pipeline instructions, forward and
backward, FSDP units, recomputation) are full-height bars coloured by kind; collective calls and
DDP's bucket waits are thinner bars inside them; each message is a thin line from where its
sender posted it to where its receiver got it. Milliseconds from the first training step.
"""

from __future__ import annotations

import json

KIND_COLOURS = {  # the first word of a span's name or its category -> colour
    "Forward": "tab:cyan",
    "Backward": "tab:purple",
    "BackwardInput": "tab:green",
    "BackwardWeight": "tab:olive",
    "recompute": "tab:red",
    "forward": "tab:cyan",
    "backward": "tab:purple",
    "collective": "tab:orange",
    "ddp": "tab:brown",
    "p2p": "tab:gray",
}
# too short to see, or around everything (a training step)
SKIP = ("SendActivation", "SendGrad", "RecvActivation", "RecvGrad", "launch", "step")


def _colour(event) -> str | None:
    first = event["name"].split(" ")[0]
    if first in SKIP:
        return None
    return KIND_COLOURS.get(first) or KIND_COLOURS.get(event.get("cat", ""), "tab:blue")


def lanes(events) -> dict:
    """(pid, tid) -> y position: rank r's threads at r, r + 0.45, ... (one row per rank)."""
    threads = sorted({(e["pid"], e["tid"]) for e in events if e["ph"] in ("X", "s", "f")})
    per_rank: dict = {}
    for pid, tid in threads:
        per_rank.setdefault(pid, []).append(tid)
    return {(pid, tid): pid + 0.45 * i for pid, tids in per_rank.items() for i, tid in
            enumerate(tids)}  # fmt: skip


def save_png(trace_path: str, png_path: str, title: str = "") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    steps = [e["ts"] for e in events if e["ph"] == "X" and e.get("cat") == "train"]
    if steps:  # from the first training step on: building the model is not the story
        events = [e for e in events if e["ph"] == "M" or e["ts"] >= min(steps)]
    t0 = min((e["ts"] for e in events if e["ph"] != "M"), default=0.0)
    events = [{**e, "ts": e["ts"] - t0} if e["ph"] != "M" else e for e in events]
    where = lanes(events)
    ranks = sorted({pid for pid, _ in where})
    fig, ax = plt.subplots(figsize=(12, 0.9 * len(ranks) + 1.5))
    for e in sorted((e for e in events if e["ph"] == "X"), key=lambda e: -e["dur"]):
        colour = _colour(e)
        if colour is None:
            continue
        y = where[e["pid"], e["tid"]]
        thin = e.get("cat") in ("collective", "ddp", "p2p")
        height = 0.16 if thin else 0.38
        ax.broken_barh([(e["ts"] / 1e3, max(e["dur"] / 1e3, 1e-3))], (y - height / 2, height),
                       color=colour, alpha=0.9 if thin else 0.75, linewidth=0)  # fmt: skip
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    for e in events:
        if (
            e["ph"] == "f"
            and e["id"] in starts
            and (starts[e["id"]]["pid"], starts[e["id"]]["tid"]) in where
        ):
            s = starts[e["id"]]
            xs, ys = (
                (s["ts"] / 1e3, e["ts"] / 1e3),
                (where[s["pid"], s["tid"]], where[e["pid"], e["tid"]]),
            )
            ax.plot(xs, ys, color="black", linewidth=0.3, alpha=0.35)
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.9, min(ranks) - 0.5)
    ax.set_xlabel("ms")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in
               ("tab:cyan", "tab:purple", "tab:red", "tab:orange", "tab:brown")]  # fmt: skip
    labels = ["forward", "backward", "recompute", "collective", "DDP bucket wait"]
    ax.legend(handles, labels, loc="upper right", fontsize=7, ncol=5)
    ax.set_title(title or "minipar trace: one row per rank (lanes: threads), lines: messages")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
