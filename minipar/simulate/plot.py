"""`minipar simulate ... --plot PATH`: simulated bus bandwidth against size, the model dashed."""

from __future__ import annotations


def busbw(rows: list[dict], path: str, title: str) -> None:
    """One line per algorithm (simulated, solid) and its cost-model prediction (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        mine = sorted((r for r in rows if r["algorithm"] == algorithm), key=lambda r: r["nbytes"])
        xs = [r["nbytes"] for r in mine]
        line = ax.plot(xs, [r["busbw_GBps"] for r in mine], "-", marker=".", label=algorithm)
        model = [(r["nbytes"], _busbw(r, r["predicted_s"])) for r in mine if r["predicted_s"]]
        if model:
            ax.plot(*zip(*model), "--", color=line[0].get_color(), alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("all-reduce size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"{title} (dashed: minipar.cost)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _busbw(row: dict, seconds: float) -> float:
    p = row["world_size"]
    return row["nbytes"] / seconds * 2 * (p - 1) / p / 1e9
