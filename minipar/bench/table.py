"""What `minipar bench` prints: the run header, one table per collective, the fit, the goals."""

from __future__ import annotations

from rich import box
from rich.panel import Panel
from rich.table import Table

from minipar import cost
from minipar.bench import fit, report
from minipar.bench.spec import format_size


def _t(seconds) -> str:
    if seconds is None:
        return ""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _x(ratio) -> str:
    if ratio is None:
        return ""
    style = "green" if ratio <= 1 else "red"
    return f"[{style}]{ratio:.2f}x[/]"


def _pct(value) -> str:
    return "" if value is None else f"{100 * value:+.0f}%" if abs(value) < 10 else f"{value:+.0f}x"


def header(console, head: dict, link_name: str, link_source: str = "") -> None:
    lines = [
        f"MPI      {head['mpi_library']}  (mpi4py {head['mpi4py']})",
        f"torch    {head['torch'] or 'not loaded'}"
        + (f"  backend {head['torch_backend']}" if head.get("torch_backend") else ""),
        f"ranks    {head['world_size']} on {head['cores']} cores ({head['host']}), load average "
        f"{head.get('load', [0])[0]:.1f} at the start",
        f"model    predictions priced on link {link_name!r}"
        + (f" ({link_source})" if link_source else ""),
    ]
    if head.get("transport"):
        lines.append(f"inside   {head['transport']}")
    if head.get("nodes"):
        n, k = head["nodes"]
        between = cost.inter_link()
        rate = head.get("link_Bps")
        priced = (
            f"the emulated link at its rate, {rate * 8 / 1e9:g} Gbit/s ({rate / 1e9:.3g} GB/s)"
            if rate
            else f"link {between.name!r} ({1 / between.beta / 1e9:.2f} GB/s)"
        )
        lines.append(
            f"nodes    {n} of {k} ranks; between them {priced}, {between.alpha * 1e6:.0f} us "
            f"a message: predictions price both links; auto chooses on {between.name!r}"
        )
    if head.get("load", [0])[0] > max(1.0, head["cores"] - head["world_size"] + 1):
        lines.append(
            "[yellow]other processes are using this machine's cores: expect noise, repeat "
            "(--repeat) and compare min times[/]"
        )
    if head["oversubscribed"]:
        lines.append(
            "[bold red]OVERSUBSCRIBED: more ranks than cores; these numbers support no claims "
            "(ranks take turns on a core)[/]"
        )
    console.print(Panel("\n".join(lines), title="minipar bench", expand=False))


def rows_table(console, rows: list[dict], collective: str) -> None:
    mine = [r for r in rows if r["collective"] == collective]
    if not mine:
        return
    p = mine[0]["world_size"]
    table = Table(title=f"{collective} on {p} ranks ({mine[0]['dtype']})", box=box.SIMPLE_HEAD)
    windows = any(r.get("window_roofline_fraction") for r in mine)  # peers' reads measured
    columns = ("size", "implementation", "median", "min", "max", "algbw GB/s", "busbw GB/s",
               "x MPI", "x gloo", "model", "error", "roofline")  # fmt: skip
    for name in columns + ("window roof",) * windows:
        table.add_column(name, justify="left" if name == "implementation" else "right")
    last = None
    for r in mine:
        if last is not None and r["nbytes"] != last:
            table.add_section()
        last = r["nbytes"]
        table.add_row(
            format_size(r["nbytes"]),
            report.label(r),
            _t(r["time_s_median"]),
            _t(r["time_s_min"]),
            _t(r["time_s_max"]),
            f"{r['algbw_GBps']:.3f}",
            f"{r['busbw_GBps']:.3f}",
            _x(r.get("ratio_mpi")),
            _x(r.get("ratio_torch")),
            _t(r["predicted_s"]),
            _pct(r.get("prediction_error")),
            _frac(r["roofline_fraction"]),
            *((_frac(r.get("window_roofline_fraction")),) if windows else ()),
        )
    console.print(table)
    if windows:
        console.print(
            "[dim]roofline: the floor at private memory's copy and add rates; window roof: at the "
            "rates of reading a peer's freshly written window buffer (cost/roofline.py)[/]"
        )


def _frac(value) -> str:
    return "" if value is None else f"{100 * value:.0f}%"


def fit_panel(console, measured: dict, rows: list[dict], link) -> None:
    p = measured["ranks"]
    lines = [
        f"alpha  {measured['alpha'] * 1e6:.1f} µs per step (fitted to the ring, 1-64 MiB; an "
        f"8-byte ping-pong: {measured.get('ping_pong_alpha', measured['alpha']) * 1e6:.1f} µs)",
        f"beta   {measured['beta'] * 1e9:.3f} ns/B = {measured['ring_GBps']:.2f} GB/s "
        f"(fitted to the ring, 1-64 MiB; a bare exchange {measured['exchange_GBps']:.2f} GB/s, "
        f"one way {measured['one_way_GBps']:.2f} GB/s)",
        f"gamma  {measured['gamma'] * 1e9:.3f} ns/B = {measured['reduce_GBps']:.2f} GB/s "
        "(numpy add, every rank at once)",
        f"saved  {measured['path']}   use it: MINIPAR_LINK={measured['path']} "
        "or minipar.cost.load_link(path)",
    ]
    if "shm_alpha" in measured:  # the shared windows' own link (bench/fit.py: measure_shm)
        lines.append(
            f"shm    alpha {measured['shm_alpha'] * 1e6:.1f} µs, beta "
            f"{measured['shm_beta'] * 1e9:.3f} ns/B ({1 / measured['shm_beta'] / 1e9:.2f} GB/s "
            "a copy through a window); saved beside it as -shm, MINIPAR_SHM_LINK uses it"
        )
    if "inter_alpha" in measured:  # the job spanned nodes: their link (fit.measure_between_nodes)
        lines.append(
            f"between nodes  alpha {measured['inter_alpha'] * 1e6:.1f} µs, beta "
            f"{measured['inter_beta'] * 1e9:.3f} ns/B ({measured['inter_ring_GBps']:.3f} GB/s; a "
            f"ring of one rank a node, {measured['nodes']} nodes; one way "
            f"{measured['inter_one_way_GBps']:.3f} GB/s); saved beside it as -inter, "
            "MINIPAR_INTER_LINK uses it"
        )
    for small in ("tree", "recursive_doubling"):
        predicted = cost.crossover("all_reduce", small, "ring", p, link)
        seen = fit.measured_crossover(rows, small, "ring")
        lines.append(
            f"ring beats {small}: predicted from "
            + (format_size(predicted) if predicted else "no size (never or always)")
            + ", measured from "
            + (
                "the smallest size measured"
                if seen == "below"
                else format_size(seen)
                if seen
                else "no size measured (or not in this sweep)"
            )
        )
    console.print(Panel("\n".join(lines), title=f"fitted link on {p} ranks", expand=False))


def goals_table(console, runs: list[list[dict]], oversubscribed: bool, basis="median") -> None:
    """minipar's performance targets (report.goals): each run's worst value; over several
    runs, min, median and max."""
    import statistics

    per_goal: dict = {}
    for rows in runs:
        for goal, value, limit, sense in report.goals(rows, basis):
            if value is not None:
                per_goal.setdefault((goal, limit, sense), []).append(value)
    if not per_goal:
        return
    runs_text = f"{len(runs)} run{'s' * (len(runs) > 1)}"
    title = f"minipar's performance targets, on each cell's {basis} time, {runs_text}"
    if oversubscribed:
        title += " — OVERSUBSCRIBED, no claims"
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for name in ("goal", "min", "median", "max", "target", ""):
        table.add_column(name, justify="left" if name == "goal" else "right")
    for (goal, limit, sense), values in per_goal.items():
        middle = statistics.median(values)
        ok = middle <= limit if sense == "<=" else middle >= limit
        pct = "roofline" in goal
        shown = [
            f"{100 * v:.0f}%" if pct else f"{v:.2f}x" for v in (min(values), middle, max(values))
        ]
        target = f"{sense} {100 * limit:.0f}%" if pct else f"{sense} {limit:g}x"
        table.add_row(goal, *shown, target, "[green]met[/]" if ok else "[red]missed[/]")
    console.print(table)
