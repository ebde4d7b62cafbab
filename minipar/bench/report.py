"""From the ranks' raw times to the records, the table, and minipar's performance targets.

One record per (collective, size, implementation, algorithm), with the keys of `--json`:
collective, algorithm, implementation, world_size, nbytes, dtype, time_s_median, time_s_min,
time_s_max, algbw_GBps, busbw_GBps, predicted_s, roofline_fraction, and a few more (ratio_mpi,
ratio_torch, prediction_error, iters, chosen).

    algbw = nbytes / time          busbw = algbw * spec.bus_factor(collective, p)
    ratio_mpi = time / MPI's time (same collective and size), ratio_torch likewise; the
    *_min ratios compare the fastest iterations (less sensitive to other processes' load)
    prediction_error = (predicted - measured) / measured (and *_min: against the fastest)
    roofline_fraction = roofline.lower_bound(...) / time; across emulated nodes whose link's
        rate the job knows, the larger floor of the two: memory's or the link's
    predicted_s inside a node: priced on the link given (the CLI's: --fit's, else
        cost.default_link(), i.e. this machine's calibration when a usable one is stored, else
        the preset); priced_on names that link and its source
    predicted_s across nodes: the part between nodes priced on the job's link (its rate; the
        alpha of --fit's between-node link, else the assumed one), not the in-node link
    window_roofline_fraction = the same floor priced at the rates of reading a peer's freshly
        written window buffer (roofline.peer_rates): what single-copy windows allow here
"""

from __future__ import annotations

import statistics

from minipar import cost
from minipar.bench import spec
from minipar.cost import roofline

KEYS = ["collective", "algorithm", "implementation", "world_size", "nbytes", "dtype",
        "time_s_median", "time_s_min", "time_s_max", "algbw_GBps", "busbw_GBps", "predicted_s",
        "roofline_fraction", "window_roofline_fraction", "link_roofline_fraction"]  # fmt: skip


def records(events: list[dict], dtype: str, link, link_Bps=None) -> list[dict]:
    """The rows of a run (events as the ranks wrote them), with every derived field;
    `link_Bps`: the rate of the link between (emulated) nodes, for its roofline."""
    header = next(e for e in events if e["type"] == "header")
    p = header["world_size"]
    roofs = {(e["collective"], e["nbytes"]): e for e in events if e["type"] == "roof"}
    shape = header.get("nodes")  # (nodes, ranks per node) when the job spans nodes
    rows = [
        _record(e, p, dtype, link, roofs, shape, link_Bps) for e in events if e["type"] == "row"
    ]
    native = {(r["collective"], r["nbytes"], r["implementation"]): r
              for r in rows if r["algorithm"] == "native"}  # fmt: skip
    for r in rows:
        for impl in ("mpi", "torch", "floor"):
            ref = native.get((r["collective"], r["nbytes"], impl))
            r[f"ratio_{impl}"] = r["time_s_median"] / ref["time_s_median"] if ref else None
            r[f"ratio_{impl}_min"] = r["time_s_min"] / ref["time_s_min"] if ref else None
    return rows


def _record(event: dict, p: int, dtype: str, link, roofs, shape=None, link_Bps=None) -> dict:
    times, n, collective = event["times"], event["nbytes"], event["collective"]
    median = statistics.median(times)
    algbw = n / median / 1e9
    record = {key: event.get(key) for key in ("collective", "algorithm", "implementation")}
    record.update(world_size=p, nbytes=n, dtype=dtype, time_s_median=median)
    record.update(time_s_min=min(times), time_s_max=max(times), algbw_GBps=algbw)
    record["busbw_GBps"] = algbw * spec.bus_factor(collective, p)
    predicted, priced = None, link
    if event["implementation"] == "minipar":
        algorithm = event.get("chosen") or event["algorithm"]
        base, _, transport = algorithm.partition("@")
        try:
            if transport == "shm":  # the shared windows' own link (cost.SHARED_WINDOW)
                owned = event["algorithm"].endswith("+window")  # read in place: bench/ops.py
                predicted = cost.predict_shm(collective, n, p, in_place=owned)
                priced = cost.shm_link()
            elif shape:  # across nodes: the in-node link and the one between, at its rate
                between = emulated_link(link_Bps, link) if link_Bps else None
                predicted = cost.predict_on_nodes(collective, base, n, *shape, link, between)
            else:
                predicted = cost.predict(collective, base, n, p, link)
        except (ValueError, KeyError):  # a user-registered algorithm has no formula
            pass
    record["predicted_s"] = predicted
    # what priced it: "calibration of DATE on HOST", "preset (...)", or --fit's
    record["priced_on"] = f"{priced.name}: {priced.source}" if predicted else None
    record["prediction_error"] = (predicted - median) / median if predicted else None
    fastest = min(times)
    record["prediction_error_min"] = (predicted - fastest) / fastest if predicted else None
    roof = roofs.get((collective, n))
    floor = roof and roofline.lower_bound(collective, n, p, roof["copy_Bps"], roof["add_Bps"])
    link_floor = shape and link_Bps and _link_floor(collective, n, shape[0], link_Bps)
    floor = max(floor or 0, link_floor or 0) or None  # the link's floor, where it is higher
    record["roofline_fraction"] = floor / median if floor else None
    peer = (
        roof
        and roof.get("peer_add_Bps")
        and roofline.lower_bound(collective, n, p, roof["peer_copy_Bps"], roof["peer_add_Bps"])
    )
    record["window_roofline_fraction"] = peer / median if peer else None
    record["link_roofline_fraction"] = link_floor / median if link_floor else None
    record["iters"] = len(times)
    if event.get("chosen"):
        record["chosen"] = event["chosen"]
    return record


def emulated_link(link_Bps: float, inside) -> cost.Link:
    """The link between emulated nodes as the job knows it: beta from its rate (--link), alpha
    from --fit's between-node link when there is one, else the assumed BETWEEN_NODES'."""
    known = cost.inter_link()
    return cost.Link(
        f"emulated {link_Bps * 8 / 1e9:g} Gbit/s",
        known.alpha,
        1 / link_Bps,
        inside.gamma,
        "the job's --link rate; alpha: " + (known.source or known.name),
    )


def label(r: dict) -> str:
    if r["implementation"] == "mpi":
        return "MPI (native)"
    if r["implementation"] == "torch":
        return "torch (gloo)"
    if r["implementation"] == "floor":
        return "python floor (mpi4py)"
    return f"{r['algorithm']} → {r['chosen']}" if r.get("chosen") else r["algorithm"]


LINK_FLOOR = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # x (N-1)/N S


def _link_floor(collective: str, nbytes: int, nodes: int, link_Bps: float):
    """Seconds the bytes that must leave a node take on the link between nodes at its rate (at
    least 2 (N-1)/N S for an all-reduce, (N-1)/N S for an all-gather or reduce-scatter,
    whatever the algorithm: every other node's part must arrive)."""
    if collective not in LINK_FLOOR or nodes < 2:
        return None
    return LINK_FLOOR[collective] * (nodes - 1) / nodes * nbytes / link_Bps


def goals(rows: list[dict], basis: str = "median") -> list[tuple[str, float | None, float, str]]:
    """minipar's performance targets for all_reduce / all_gather / reduce_scatter, as (goal,
    measured worst value, limit, "<=" or ">="); None where the run did not measure it. basis
    "min" compares each cell's fastest iteration instead of its median."""
    if basis == "min":
        faster = lambda r, f: f and f * r["time_s_median"] / r["time_s_min"]  # noqa: E731
        rows = [dict(r, ratio_mpi=r.get("ratio_mpi_min"), ratio_torch=r.get("ratio_torch_min"),
                     ratio_floor=r.get("ratio_floor_min"),
                     roofline_fraction=faster(r, r["roofline_fraction"]),
                     window_roofline_fraction=faster(r, r.get("window_roofline_fraction")),
                     link_roofline_fraction=faster(r, r.get("link_roofline_fraction")))
                for r in rows]  # fmt: skip

    def pick(collective, algorithm, impl="minipar", min_bytes=0, exact=None):
        return [r for r in rows if r["collective"] == collective and r["implementation"] == impl
                and r["algorithm"] == algorithm and r["nbytes"] >= min_bytes
                and (exact is None or r["nbytes"] == exact)]  # fmt: skip

    def worst(rs, key, fn=max):
        values = [r[key] for r in rs if r.get(key) is not None]
        return fn(values) if values else None

    mib64, mib1 = 64 << 20, 1 << 20
    minipar_rows = [r for r in rows if r["implementation"] == "minipar"]
    latency = pick("all_reduce", "recursive_doubling", exact=8) + pick(
        "all_reduce", "tree", exact=8
    )
    best_latency = worst(latency, "ratio_mpi", min)
    owned = pick("all_reduce", "ring+window", exact=mib64)
    return [
        ("ring all_reduce 64 MiB: fraction of roofline",
         worst(pick("all_reduce", "ring", exact=mib64), "roofline_fraction", min), 0.70, ">="),
        ("ring all_reduce, window buffer, 64 MiB: fraction of the window roofline",
         worst(owned, "window_roofline_fraction", min), 0.70, ">="),
        ("ring all_reduce, window buffer, 64 MiB: fraction of the private roofline",
         worst(owned, "roofline_fraction", min), 0.70, ">="),
        ("ring all_reduce >= 1 MiB: time / MPI (worst size)",
         worst(pick("all_reduce", "ring", min_bytes=mib1), "ratio_mpi"), 1.0, "<="),
        ("latency-optimal all_reduce 8 B: time / MPI (best of rd, tree)", best_latency, 2.0, "<="),
        ("latency-optimal all_reduce 8 B: time / python floor (best of rd, tree)",
         worst(latency, "ratio_floor", min), 1.5, "<="),
        ("auto all_reduce 8 B: time / MPI",
         worst(pick("all_reduce", "auto", exact=8), "ratio_mpi"), 2.0, "<="),
        ("auto all_reduce 8 B: time / python floor",
         worst(pick("all_reduce", "auto", exact=8), "ratio_floor"), 1.5, "<="),
        ("auto: time / gloo (worst size)",
         worst([r for r in minipar_rows if r["algorithm"] == "auto"], "ratio_torch"), 0.5, "<="),
        ("every minipar algorithm: time / gloo (worst)", worst(minipar_rows, "ratio_torch"), 1.0,
         "<="),
        ("ring all_gather 64 MiB: time / MPI",
         worst(pick("all_gather", "ring", exact=mib64), "ratio_mpi"), 1.0, "<="),
        ("ring reduce_scatter 64 MiB: time / MPI",
         worst(pick("reduce_scatter", "ring", exact=mib64), "ratio_mpi"), 1.0, "<="),
        ("hierarchical all_reduce 64 MiB across nodes: fraction of the link's roofline",
         worst(pick("all_reduce", "hierarchical", exact=mib64), "link_roofline_fraction", min),
         0.80, ">="),
        ("hierarchical all_reduce >= 1 MiB across nodes: time / MPI (worst size)",
         worst([r for r in pick("all_reduce", "hierarchical", min_bytes=mib1)
                if r.get("link_roofline_fraction") is not None], "ratio_mpi"), 1.0, "<="),
    ]  # fmt: skip
