"""Does the emulated link behave like a wire under minipar's waits? (docs/cluster.md, issue 62)

    python scripts/wire_table.py [--rates unlimited,2gbit,500mbit] [--per-node 1,2] [--busy]

As root (emulated nodes). For each link rate and ranks per node, one job on 2 nodes: rank 0 and
the first rank of node1 ping-pong, an idle pause before each exchange (as between a step's
collectives) while the other ranks wait in minipar's barrier, with minipar's send/recv and with
raw mpi4py Send/Recv on the same ranks in the same job. It prints
  (a) minipar's round trip against raw mpi4py's, 64 KiB .. 64 MiB;
  (b) the wire table: minipar's one-way time / (alpha + n / rate), alpha the 8 B one-way time
      measured in the same job, rate the link's (shaped links only).
--busy runs every job beside one busy process (a spinning Python). Each cell is the median of
its repeats; the machine's load average is printed beside each job.

    python scripts/wire_table.py --steps --trees BEFORE,AFTER

times what the naps made fast, and what crosses nodes, with minipar imported from each checkout
in turn (so that before and after see the same load): the two-level all-reduce against
MPI_Allreduce across 2 nodes x 2 ranks (minipar bench, 1-64 MiB, --repeat 3), lesson 01's
ping-pong across the link, a pipeline step with its two stages on different nodes, and the
tiny GPT's 3D step on 8 ranks on one node.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
WIRE_SIZES = [64 << 10, 1 << 20, 4 << 20, 64 << 20]
PAUSE = 0.002  # seconds idle before each exchange, on both ranks


def round_trip(send, recv, buf, peer: int, first: bool, reps: int) -> list[float]:
    """[min, median] round trip (seconds) of `buf` between this rank and `peer`."""
    times = []
    for _ in range(reps + 1):  # the first is a warm-up
        time.sleep(PAUSE)
        t0 = time.perf_counter()
        if first:
            send(buf, peer)
            recv(buf, peer)
        else:
            recv(buf, peer)
            send(buf, peer)
        times.append(time.perf_counter() - t0)
    return [min(times[1:]), statistics.median(times[1:])]


def rank_main(sizes):
    """Rank 0 and the first rank of node1 ping-pong; rank 0 prints one RESULT line."""
    import numpy as np
    from mpi4py import MPI

    import minipar

    comm = minipar.init()
    raw = MPI.COMM_WORLD
    peer = minipar.node_map().index(1)  # node1's first rank
    result = {"minipar": {}, "raw": {}}
    for nbytes in [8, *sizes]:
        buf = np.zeros(nbytes, dtype=np.uint8)
        reps = 20 if nbytes <= 1 << 20 else 5 if nbytes <= 4 << 20 else 3
        for name, send, recv in (
            ("minipar", comm.send, comm.recv),
            (
                "raw",
                lambda b, p: raw.Send([b, MPI.BYTE], p),
                lambda b, p: raw.Recv([b, MPI.BYTE], p),
            ),
        ):
            if comm.rank in (0, peer):
                other = peer if comm.rank == 0 else 0
                result[name][nbytes] = round_trip(send, recv, buf, other, comm.rank == 0, reps)
            minipar.barrier()  # the other ranks wait here meanwhile
    if comm.rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    minipar.finalize()


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def job(rate: str, per_node: int, sizes, busy: bool) -> dict:
    """One `minipar run --nodes 2` job of rank_main; its RESULT."""
    cmd = [sys.executable, "-m", "minipar", "run", "--nodes", "2", "-n", str(2 * per_node),
           "--link", rate, __file__, "--rank", "--sizes", ",".join(map(str, sizes))]  # fmt: skip
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not line:
        sys.exit(f"job {cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {k: {int(n): t for n, t in v.items()} for k, v in json.loads(line[0][7:]).items()}


def size_name(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def pingpong(args):
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else SIZES
    for rate in args.rates.split(","):
        for per_node in (int(k) for k in args.per_node.split(",")):
            before = load()
            res = job(rate, per_node, sizes, args.busy)
            beside = ", beside a busy process" if args.busy else ""
            print(f"\n{rate}, {per_node} rank(s) a node{beside} ({before} before, {load()} after)")
            table(res, sizes, rate)


def table(res, sizes, rate: str) -> None:
    """(a) minipar's median round trip against raw's; (b) on a shaped link, minipar's one-way
    time / (alpha + n / rate), alpha its 8 B one-way time, from the medians and from the mins
    (the mins are what a busy machine distorts least)."""
    from minipar.launcher.cluster import link

    bits = link.parse(rate)
    print("  size      minipar RT   raw RT      minipar/raw" + (
        "   one-way / (alpha + n/rate): median (min)" if bits else ""))  # fmt: skip
    for n in sizes:
        (low, mine), raw = res["minipar"][n], res["raw"][n][1]
        wire = ""
        if bits:
            ratios = [
                t / 2 / (a / 2 + n * 8 / bits)
                for t, a in ((mine, res["minipar"][8][1]), (low, res["minipar"][8][0]))
            ]
            wire = f"   {ratios[0]:.2f} ({ratios[1]:.2f})"
            wire += "" if n in WIRE_SIZES else " (not in the goal's table)"
        print(f"  {size_name(n):8} {mine * 1e3:9.2f} ms {raw * 1e3:9.2f} ms"
              f"   {mine / raw:6.2f}x{wire}")  # fmt: skip
    print(f"  alpha (8 B one-way, median): minipar {res['minipar'][8][1] / 2 * 1e6:.0f} us, "
          f"raw {res['raw'][8][1] / 2 * 1e6:.0f} us")  # fmt: skip


def run(cmd, tree: str, timeout=600) -> str:
    """`cmd`'s output, with minipar imported from `tree` (a checkout's root)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200", PYTHONPATH=tree)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode:
        sys.exit(f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def grep(out: str, pattern: str) -> str:
    return "\n".join(ln.rstrip() for ln in out.splitlines() if re.search(pattern, ln))


def spread(values, scale=1e3) -> str:
    v = sorted(values)
    return " / ".join(f"{x * scale:.3g}" for x in (v[0], statistics.median(v), v[-1]))


def all_reduce_runs(tree: str) -> str:
    """The two-level all-reduce and MPI_Allreduce across 2 x 2 nodes, 3 runs of minipar bench:
    each size's median time, min / median / max over the runs, and their ratio."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "rows.json")
        run([sys.executable, "-m", "minipar", "bench", "all_reduce", "--nodes", "2", "-n", "4",
             "--sizes", "1MiB,4MiB,16MiB,64MiB", "--algorithms", "hierarchical", "--against",
             "mpi", "--repeat", "3", "--json", path], tree)  # fmt: skip
        with open(path) as f:
            rows = json.load(f)
    lines = ["  size     hierarchical ms      MPI_Allreduce ms     hierarchical / MPI"]
    for n in sorted({r["nbytes"] for r in rows}):
        mine = [r for r in rows if r["nbytes"] == n and r["algorithm"] == "hierarchical"]
        mpi = [r for r in rows if r["nbytes"] == n and r["algorithm"] == "native"]
        lines.append(f"  {size_name(n):8} {spread([r['time_s_median'] for r in mine]):20} "
                     f"{spread([r['time_s_median'] for r in mpi]):20} "
                     f"{spread([r['ratio_mpi'] for r in mine], 1)}")  # fmt: skip
    return "\n".join(lines)


def steps(args):
    """What the naps made fast, and what crosses nodes, each with every tree in turn (so that
    before and after see the same load), as minipar's own tools print them."""
    me = [sys.executable, "-m", "minipar"]
    train = [sys.executable, "-m", "minipar", "train", "--steps", "6", "--layers", "4",
             "--batch-size", "16", "--seq", "128"]  # fmt: skip
    checks = [
        ("two-level all-reduce vs MPI_Allreduce, 2 nodes x 2 ranks, 2gbit", all_reduce_runs),
        ("lesson 01 --quick --nodes 2", lambda tree: grep(run(
            me + ["lesson", "01", "--quick", "--nodes", "2"], tree), r"rank 0 - |PASS|FAIL")),
        ("pipeline, its 2 stages on 2 nodes (2gbit)", lambda tree: grep(run(
            me + ["run", "--nodes", "2", "-n", "2", *train, "--pp", "2"], tree), "step time")),
        ("3D step, 8 ranks on one node", lambda tree: grep(run(
            me + ["run", "-n", "8", *train, "--dp", "2", "--tp", "2", "--pp", "2"], tree),
            "step time")),
    ]  # fmt: skip
    for what, measure in checks:
        for tree in args.trees.split(","):
            before = load()
            out = measure(tree)
            print(
                f"\n{what}: {os.path.basename(tree.rstrip('/'))} ({before} before, {load()} after)"
            )
            print(out, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="unlimited,2gbit,500mbit")
    parser.add_argument("--per-node", default="1,2")
    parser.add_argument(
        "--sizes", default="", help="bytes, comma separated (default 64 KiB..64 MiB)"
    )
    parser.add_argument("--busy", action="store_true", help="beside one busy process")
    parser.add_argument("--steps", action="store_true", help="the steps the naps made fast")
    parser.add_argument("--trees", default=".", help="--steps: checkouts to compare, comma list")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main([int(s) for s in args.sizes.split(",")])
    elif args.steps:
        steps(args)
    else:
        pingpong(args)


if __name__ == "__main__":
    main()
