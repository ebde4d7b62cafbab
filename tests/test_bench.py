"""`minipar bench`: the parsing and the arithmetic on their own, then one real 2-rank run."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import warm_python

from minipar import cost
from minipar.bench import fit, report, spec

KEYS = set(report.KEYS)


def test_sizes():
    assert spec.parse_sizes("8B:64B") == [8, 16, 32, 64]
    assert spec.parse_sizes("1KiB:1MiB:x4") == [
        1 << 10,
        1 << 12,
        1 << 14,
        1 << 16,
        1 << 18,
        1 << 20,
    ]
    assert spec.parse_sizes("8:20:x4") == [8, 20]  # the end is always measured
    assert spec.parse_sizes("64MiB,8,1KB") == [8, 1000, 64 << 20]
    for bad in ("8Q", "64MiB:8", "1:8:x1", ""):
        with pytest.raises(ValueError):
            spec.parse_sizes(bad)
    assert spec.format_size(3 << 19) == "1.5 MiB" and spec.format_size(8) == "8 B"


def test_collectives_and_rounding():
    assert spec.parse_collectives("allreduce,all_gather_into_tensor") == [
        "all_reduce",
        "all_gather",
    ]
    assert spec.parse_collectives("all") == spec.COLLECTIVES
    with pytest.raises(ValueError, match="unknown collective"):
        spec.parse_collectives("all_sum")
    assert spec.round_size("all_reduce", 7, 3, 4) == 8  # whole items
    assert spec.round_size("all_gather", 8, 3, 4) == 12  # p equal blocks of whole items
    assert spec.round_size("reduce_scatter", 1 << 20, 2, 4) == 1 << 20


def test_bus_factors_follow_nccl_tests():
    assert spec.bus_factor("all_reduce", 4) == 1.5
    assert spec.bus_factor("all_gather", 4) == spec.bus_factor("reduce_scatter", 4) == 0.75
    assert spec.bus_factor("broadcast", 4) == spec.bus_factor("reduce", 4) == 1.0
    assert spec.bus_factor("all_to_all", 8) == 7 / 8


def _events(p=2):
    """What the ranks would write for one size: two minipar rows, MPI, gloo, a roofline."""
    n = 1 << 20
    return [
        {"type": "header", "world_size": p, "oversubscribed": False},
        {"type": "roof", "collective": "all_reduce", "nbytes": n, "copy_Bps": 8e9, "add_Bps": 8e9},
        {"type": "row", "collective": "all_reduce", "nbytes": n, "implementation": "minipar",
         "algorithm": "ring", "times": [3e-4, 1e-4, 2e-4]},
        {"type": "row", "collective": "all_reduce", "nbytes": n, "implementation": "minipar",
         "algorithm": "auto", "chosen": "tree", "times": [4e-4]},
        {"type": "row", "collective": "all_reduce", "nbytes": n, "implementation": "mpi",
         "algorithm": "native", "times": [1e-4]},
        {"type": "row", "collective": "all_reduce", "nbytes": n, "implementation": "torch",
         "algorithm": "native", "times": [8e-4]},
    ]  # fmt: skip


def test_records_arithmetic():
    link = cost.SHARED_MEMORY
    ring, auto, mpi, gloo = report.records(_events(), "float32", link)
    n = 1 << 20
    assert KEYS <= set(ring)
    assert (ring["time_s_min"], ring["time_s_median"], ring["time_s_max"]) == (1e-4, 2e-4, 3e-4)
    assert ring["algbw_GBps"] == pytest.approx(n / 2e-4 / 1e9)
    assert ring["busbw_GBps"] == pytest.approx(ring["algbw_GBps"] * 1.0)  # 2 (p-1)/p at p=2
    assert ring["ratio_mpi"] == pytest.approx(2.0) and ring["ratio_torch"] == pytest.approx(0.25)
    assert ring["predicted_s"] == pytest.approx(cost.predict("all_reduce", "ring", n, 2, link))
    assert auto["predicted_s"] == pytest.approx(cost.predict("all_reduce", "tree", n, 2, link))
    assert mpi["predicted_s"] is None and mpi["ratio_mpi"] == 1.0
    floor = n / 2 / 8e9 * 2
    assert ring["roofline_fraction"] == pytest.approx(floor / 2e-4)
    assert report.label(auto) == "auto → tree" and report.label(gloo) == "torch (gloo)"


def test_goals_read_the_right_rows():
    rows = report.records(_events(), "float32", cost.SHARED_MEMORY)
    goals = {g[0]: g for g in report.goals(rows)}
    worst_mpi = goals["ring all_reduce >= 1 MiB: time / MPI (worst size)"]
    assert worst_mpi[1] == pytest.approx(2.0)
    assert goals["auto: time / gloo (worst size)"][1] == pytest.approx(0.5)
    assert goals["ring all_gather 64 MiB: time / MPI"][1] is None  # not measured


def test_measured_crossover():
    def row(n, algorithm, t):
        return {"collective": "all_reduce", "implementation": "minipar", "nbytes": n,
                "algorithm": algorithm, "time_s_median": t}  # fmt: skip

    rows = [row(8, "tree", 1), row(8, "ring", 2), row(64, "tree", 2), row(64, "ring", 1)]
    rows += [row(512, "tree", 3), row(512, "ring", 1)]
    assert fit.measured_crossover(rows, "tree", "ring") == 64
    assert fit.measured_crossover(rows[:2], "tree", "ring") is None
    assert fit.measured_crossover(rows[2:], "tree", "ring") == "below"


def test_relative_slope_fits_a_line_and_weighs_sizes_alike():
    sizes = [1 << k for k in range(20, 27)]
    alpha, beta = 5e-6, 2e-10
    exact = [alpha + n * beta for n in sizes]
    assert fit.relative_slope(sizes, exact, alpha) == pytest.approx(beta, rel=1e-12)
    # one size 2x slower (a cache edge): a two-point slope through it is off by ~2x at the
    # other end; the relative fit keeps every other size within a few tens of percent
    bumped = list(exact)
    bumped[-1] *= 2
    b = fit.relative_slope(sizes, bumped, alpha)
    errors = [(alpha + n * b - t) / t for n, t in zip(sizes, bumped)]
    assert max(abs(e) for e in errors[:-1]) < 0.2 and abs(errors[-1]) < 0.5, errors


@pytest.mark.slow  # CI's long checks only (MINIPAR_EXTENDED=1)
@pytest.mark.own_job
@pytest.mark.timeout(150)
def test_two_rank_run(tmp_path):
    """One short job: every key, positive times, busbw = algbw x factor, the fit stored."""
    out, png, link = tmp_path / "out.json", tmp_path / "bw.png", tmp_path / "link.json"
    argv = [*warm_python(["-m", "minipar"]), "bench", "all_reduce,all_gather,reduce_scatter",
            "-n", "2", "--sizes", "8,128KiB",
            "--algorithms", "ring,recursive_doubling,auto,ring+window",
            "--against", "mpi,torch", "--iters", "3", "--warmup", "1", "--json", str(out),
            "--plot", str(png), "--fit", "--fit-path", str(link), "--timeout", "120"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=140)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "x MPI" in done.stdout and "fitted link" in done.stdout
    rows = json.loads(out.read_text())
    seen = {(r["collective"], r["implementation"], r["algorithm"]) for r in rows}
    for collective in ("all_reduce", "all_gather", "reduce_scatter"):
        assert {(collective, "mpi", "native"), (collective, "torch", "native")} <= seen
        assert (collective, "minipar", "ring") in seen and (collective, "minipar", "auto") in seen
        assert (collective, "minipar", "ring+window") in seen  # a buffer from minipar.empty
    assert ("all_reduce", "minipar", "recursive_doubling") in seen
    owned = [r for r in rows if r["algorithm"] == "ring+window" and r["nbytes"] > 64 << 10]
    assert owned and all(r.get("chosen") == "ring@shm" for r in owned), owned  # read in place
    assert all(r["window_roofline_fraction"] > 0 for r in rows)  # the peers' read rates
    for r in rows:
        assert KEYS <= set(r), KEYS - set(r)
        assert r["world_size"] == 2 and r["dtype"] == "float32" and r["iters"] == 3
        assert 0 < r["time_s_min"] <= r["time_s_median"] <= r["time_s_max"] < 10
        assert r["algbw_GBps"] == pytest.approx(r["nbytes"] / r["time_s_median"] / 1e9)
        factor = spec.bus_factor(r["collective"], 2)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor)
        assert r["roofline_fraction"] > 0
        if r["implementation"] == "minipar":
            assert r["predicted_s"] > 0
    fitted = cost.load_link(str(link))
    assert 0 < fitted.alpha < 0.01 and 0 < fitted.beta < 1e-8 and 0 < fitted.gamma < 1e-8
    assert png.stat().st_size > 1000


def _record(i: int, n: int = 4000) -> dict:
    """A row as long as a fast size's (thousands of times: tens of kB, more than one write)."""
    return {"type": "row", "i": i, "times": [1e-5 + j * 1.2345678e-9 for j in range(n)]}


def test_the_events_reader_never_crashes_on_a_torn_line(tmp_path):
    """Issue 56: a line holding two records, one starting inside a record, one half written:
    the reader keeps the whole records, counts the torn ones, and takes the half once it ends
    (it crashed with JSONDecodeError: Extra data)."""
    from minipar.bench import events
    from minipar.cli import bench

    path = tmp_path / "out.jsonl"
    whole = [json.dumps(_record(k, 40)) for k in range(3)]
    half = json.dumps(_record(3, 40))
    path.write_text(f"{whole[0]}\n{whole[1]}{whole[2]}\n{whole[2][30:]}\n{whole[2]}\n{half[:50]}")
    assert [e["i"] for e in bench._read(str(path))] == [0, 2]
    follow = events.Follower(str(path))
    assert [e["i"] for e in follow.read()] == [0, 2] and follow.unreadable == 2
    with open(path, "a") as f:
        f.write(half[50:] + "\n")
    assert [e["i"] for e in follow.read()] == [0, 2, 3] and follow.unreadable == 2


def test_a_long_record_is_followed_whole_while_written(tmp_path):
    """Records of ~100 kB written in 4 kB pieces while the follower reads: each comes back
    whole, once, in order, none torn."""
    import os
    import threading

    from minipar.bench import events

    path = str(tmp_path / "out.jsonl")
    open(path, "w").close()
    sent = [_record(k) for k in range(20)]

    def write():
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        for r in sent:
            data = (json.dumps(r) + "\n").encode()
            for k in range(0, len(data), 4096):
                os.write(fd, data[k : k + 4096])
        os.close(fd)

    writer = threading.Thread(target=write)
    follow, sizes = events.Follower(path), []
    writer.start()
    while writer.is_alive():
        sizes.append(len(follow.read()))
    writer.join()
    assert follow.read() == sent and follow.unreadable == 0
    assert sizes == sorted(sizes)


def test_one_writer_per_events_file(tmp_path):
    from minipar.bench import events

    path = str(tmp_path / "out.jsonl")
    first = events.Writer(path)
    with pytest.raises(RuntimeError, match="another process writes the bench events file"):
        events.Writer(path)
    first.emit("row", times=[0.5] * 3000)  # longer than Python's 8 kB buffer: one write
    first.close()
    assert events.read(path) == [{"type": "row", "times": [0.5] * 3000}]
    events.Writer(path).close()  # the lock went with the first


@pytest.mark.own_job
@pytest.mark.timeout(150)
def test_two_benches_at_once_with_long_records(tmp_path):
    """Issue 56's crash came under load: two jobs at once, rows of 600 times each (~13 kB,
    more than one buffered write): both finish, each with its own rows, whole."""
    procs = []
    for k in range(2):
        argv = [*warm_python(["-m", "minipar"]), "bench", "all_reduce", "-n", "2",
                "--sizes", "8", "--algorithms", "ring", "--against", "mpi",
                "--iters", "600", "--warmup", "1", "--json", str(tmp_path / f"{k}.json"),
                "--timeout", "120"]  # fmt: skip
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))  # fmt: skip
    for k, proc in enumerate(procs):
        out, err = proc.communicate(timeout=140)
        assert proc.returncode == 0, out[-2000:] + err[-2000:]
        assert "unreadable" not in err, err
        rows = json.loads((tmp_path / f"{k}.json").read_text())
        cells = {(r["nbytes"], r["implementation"], r["algorithm"]) for r in rows}
        assert len(rows) == len(cells) == 3, cells  # ring, MPI and the floor, once each
        assert {(8, "minipar", "ring"), (8, "mpi", "native")} <= cells, cells
        assert all(r["iters"] == 600 for r in rows)


def test_window_roofline_and_the_window_buffer_row():
    """A roof event with peer-read rates prices the window roofline; a "ring+window" row (a
    buffer from minipar.empty) is priced in place and feeds the owned-buffer goals."""
    n = 64 << 20
    events = [
        {"type": "header", "world_size": 2, "oversubscribed": False},
        {"type": "roof", "collective": "all_reduce", "nbytes": n, "copy_Bps": 8e9,
         "add_Bps": 8e9, "peer_copy_Bps": 4e9, "peer_add_Bps": 2e9},
        {"type": "row", "collective": "all_reduce", "nbytes": n, "implementation": "minipar",
         "algorithm": "ring+window", "chosen": "ring@shm", "times": [0.02, 0.01, 0.03]},
    ]  # fmt: skip
    (row,) = report.records(events, "float32", cost.SHARED_MEMORY)
    private, window = n / 2 / 8e9 * 2, n / 2 / 2e9 + n / 2 / 4e9
    assert row["roofline_fraction"] == pytest.approx(private / 0.02)
    assert row["window_roofline_fraction"] == pytest.approx(window / 0.02)
    assert row["predicted_s"] == pytest.approx(cost.predict_shm("all_reduce", n, 2, in_place=True))
    assert cost.predict_shm("all_reduce", n, 2, in_place=True) < cost.predict_shm(
        "all_reduce", n, 2
    )  # no copy in
    goals = {g[0]: g[1] for g in report.goals([row])}
    assert goals["ring all_reduce, window buffer, 64 MiB: fraction of the window roofline"] == (
        pytest.approx(window / 0.02)
    )
    fastest = {g[0]: g[1] for g in report.goals([row], basis="min")}
    key = "ring all_reduce, window buffer, 64 MiB: fraction of the private roofline"
    assert fastest[key] == pytest.approx(private / 0.01)


def test_tensor_bytes_counts_shared_memory_once():
    """bench ddp's memory: a gradient that is a view of its bucket is not counted twice."""
    import torch

    from minipar.bench import ddp

    bucket = torch.zeros(100)
    views = [bucket[:40], bucket[40:], bucket[10:20]]
    assert ddp.tensor_bytes([bucket, *views, None]) == 400
    assert ddp.tensor_bytes([torch.zeros(3), torch.zeros(5, dtype=torch.float64)]) == 52


def test_strategy_tables_show_ratios_per_run(capsys):
    """bench ddp / fsdp: min / median / max of minipar's step over torch's, each run's own;
    bench pp: the same per schedule, against torch's 1F1B of the same run."""
    from rich.console import Console

    from minipar.bench import ddp, pipeline

    console = Console(width=200)
    data = {"times": {"compute only": [0.1, 0.1, 0.1], "minipar FSDP": [0.2, 0.3, 0.4],
                      "torch FSDP": [0.4, 0.3, 0.2]}}  # fmt: skip
    ddp.show_times(console, data, "t")
    out = capsys.readouterr().out
    assert "0.50x / 1.00x / 2.00x" in out and "200.0" in out  # ratios per run; exposed comm
    rows = [{"p": 2, "schedule": s, "times": [t, t, t], "repeat": k}
            for k, (ours, theirs) in enumerate([(0.03, 0.04), (0.05, 0.04)])
            for s, t in (("1f1b", ours), ("torch 1F1B", theirs))]  # fmt: skip
    pipeline.show(console, rows)
    out = capsys.readouterr().out
    assert "0.75x / 1.00x / 1.25x" in out and "2 runs" in out


def test_bench_cp_and_moe_tables_and_json(tmp_path):
    """`minipar bench cp` and `minipar bench moe`'s command side: the table printed from a
    finished job's result and the --json record (the jobs themselves run in the lessons' and the
    bench's own runs, not here: seconds of attention and expert steps on loaded cores)."""
    import io

    from minipar.bench import context, moe
    from minipar.term import Console

    out = io.StringIO()
    console = Console(file=out, width=200)
    result = {
        "times": {
            "dense": [0.3, 0.2, 0.4],
            "ring": [0.1, 0.3, 0.2],
            "ulysses": [0.1, 0.1, 0.1],
            "ring-comm": [0.04, 0.04],
            "ulysses-comm": [0.02, 0.02],
        },
        "waits": {"ring": 0.01, "ulysses": 0.03},
        "cp": 2,
        "shape": {"batch": 1, "heads": 8, "seq": 1024, "head_dim": 64},
    }
    rows = context.show(console, result, 3, 2, str(tmp_path / "cp.json"))
    text = out.getvalue()
    assert "cp=2" in text and "(1, 8, 1024, 64)" in text and "75%" in text, text
    assert json.load(open(tmp_path / "cp.json")) == rows and rows[1]["cell"] == "ring"
    times = {"moe/ep": [0.3, 0.1, 0.2], "moe/local": [0.4, 0.4, 0.5], "comm/ep": [0.05, 0.05],
             "bytes/ep": [2048.0], "imbalance/ep": [1.25]}  # fmt: skip
    record = moe.show(console, times, 3, 2, str(tmp_path / "moe.json"))
    text = out.getvalue()
    assert "ep=2" in text and "25%" in text and "2,048" in text and "1.25" in text, text
    assert json.load(open(tmp_path / "moe.json")) == record
    assert record["rows"][0]["x_local"] == pytest.approx(0.5)


def test_rows_across_nodes_price_both_links_and_the_links_roofline():
    """A run on 2 nodes of 2 (the header's `nodes`): a row's prediction is predict_on_nodes,
    the link's roofline is 2 (N-1)/N S at the link's rate, and the two-level goals read them."""
    n, rate = 64 << 20, 0.25e9
    events = [
        {"type": "header", "world_size": 4, "oversubscribed": False, "nodes": [2, 2]},
        {"type": "row", "collective": "all_reduce", "nbytes": n, "implementation": "minipar",
         "algorithm": "hierarchical", "times": [0.4, 0.3, 0.5]},
        {"type": "row", "collective": "all_reduce", "nbytes": n, "implementation": "mpi",
         "algorithm": "native", "times": [0.6]},
    ]  # fmt: skip
    two, _ = report.records(events, "float32", cost.SHARED_MEMORY, rate)
    link = cost.SHARED_MEMORY
    between = cost.Link("2 Gbit/s", cost.inter_link().alpha, 1 / rate, link.gamma)
    assert two["predicted_s"] == pytest.approx(
        cost.predict_on_nodes("all_reduce", "hierarchical", n, 2, 2, link, between)
    )
    # priced on the job's link, never below what the link alone needs: 2 (N-1)/N S at its rate
    assert two["predicted_s"] >= n / rate
    assert two["link_roofline_fraction"] == pytest.approx(n / rate / 0.4)
    assert two["roofline_fraction"] == pytest.approx(n / rate / 0.4)  # the link's floor
    goals = {g[0]: g[1] for g in report.goals([two, _])}
    assert goals["hierarchical all_reduce 64 MiB across nodes: fraction of the link's roofline"]
    assert goals["hierarchical all_reduce >= 1 MiB across nodes: time / MPI (worst size)"] == (
        pytest.approx(0.4 / 0.6)
    )


def test_link_needs_nodes():
    from argparse import Namespace

    from minipar.cli import bench

    with pytest.raises(ValueError, match="give --nodes N too"):
        bench.job_spec(Namespace(link="2gbit", nodes=None))


@pytest.mark.parametrize(
    "argv,says",
    [
        (["ddp", "--link", "2gbit"], "give --nodes N too"),
        (["fsdp", "--link", "500mbit"], "give --nodes N too"),
        (["tp", "--nodes", "2", "-n", "4"], "this one runs on one node"),
        (["moe", "--link", "2gbit"], "this one runs on one node"),
    ],
)
def test_strategy_benches_refuse_nodes_they_cannot_use(argv, says, capsys):
    """bench ddp and fsdp run on emulated nodes; --link without --nodes is refused there as for
    the collectives, and the benches that run on one node refuse both: exit 2, nothing run."""
    import argparse

    from minipar.cli import bench

    parser = argparse.ArgumentParser()
    bench.configure(parser)
    assert bench.main(parser.parse_args(argv)) == 2
    said = capsys.readouterr()
    assert says in said.out + said.err
