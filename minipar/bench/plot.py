"""`--plot`: bus bandwidth against message size, one line per implementation and algorithm."""

from __future__ import annotations

from minipar.bench import report


def busbw(rows: list[dict], path: str, head: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = list(dict.fromkeys(r["collective"] for r in rows))
    fig, axes = plt.subplots(
        1, len(collectives), figsize=(6 * len(collectives), 4.5), squeeze=False
    )
    for ax, collective in zip(axes[0], collectives):
        lines: dict = {}
        for r in rows:
            if r["collective"] == collective:
                name = report.label(r).split(" → ")[0]
                lines.setdefault(name, []).append((r["nbytes"], r["busbw_GBps"]))
        for name, points in lines.items():
            xs, ys = zip(*sorted(points))
            style = "--" if name.startswith(("MPI", "torch")) else "-"
            ax.plot(xs, ys, style, marker=".", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{collective}, {head['world_size']} ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if head.get("oversubscribed"):
        fig.suptitle("OVERSUBSCRIBED (more ranks than cores): no claims", color="red")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
