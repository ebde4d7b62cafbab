"""Measure the emulated cluster (docs/cluster.md): bring-up and tear-down of N = 2, 4 nodes, and
ping-pong inside a node and across nodes (8 B latency, 1 MiB and 64 MiB bandwidth) at two link
rates, each the median of its repeats, min / median / max over `--repeat` jobs.

    python scripts/cluster_measure.py [--repeat 3] [--rates 500mbit,2gbit]

As root (namespaces and tc). The rank side is this same file under `minipar run --nodes 2 -n 4`
(ranks 0, 1 on node0; 2, 3 on node1): rank 0 ping-pongs with rank 1 (inside node0) and with
rank 2 (across the link) and prints one JSON line.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = [8, 1 << 20, 64 << 20]


def ping_pong(comm, peer, nbytes, reps):
    """Half a round trip's seconds, median of `reps`, between this rank and `peer`."""
    import numpy as np

    buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        if comm.rank == 0:
            comm.send(buf, peer)
            comm.recv(buf, peer)
        else:
            comm.recv(buf, 0)
            comm.send(buf, 0)
        times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times[1:])


def rank_main():
    import minipar

    comm = minipar.init()
    result = {}
    for where, peer in (("inside", 1), ("across", 2)):
        for nbytes in SIZES:
            reps = 50 if nbytes <= 1 << 20 else 5
            if comm.rank in (0, peer):
                result[f"{where}.{nbytes}"] = ping_pong(comm, peer if comm.rank == 0 else 0,
                                                        nbytes, reps)  # fmt: skip
            minipar.barrier()
    if comm.rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    minipar.finalize()


def bring_up(repeat):
    from minipar.launcher.cluster.nodes import EmulatedCluster

    rows = {}
    for n in (2, 4):
        ups, downs = [], []
        for _ in range(repeat):
            cluster = EmulatedCluster(n, "2gbit")
            cluster.up()
            cluster.down()
            ups.append(cluster.timings["up"])
            downs.append(cluster.timings["down"])
        rows[n] = (ups, downs)
    return rows


def spread(values, scale=1.0, fmt="{:.3g}"):
    v = sorted(x * scale for x in values)
    return " / ".join(fmt.format(x) for x in (v[0], statistics.median(v), v[-1]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rates", default="500mbit,2gbit")
    args = parser.parse_args()
    for n, (ups, downs) in bring_up(args.repeat).items():
        print(f"{n} nodes: up {spread(ups, 1e3)} ms, down {spread(downs, 1e3)} ms")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for rate in args.rates.split(","):
        runs = []
        for _ in range(args.repeat):
            done = subprocess.run(
                [sys.executable, "-m", "minipar", "run", "--nodes", "2", "-n", "4", "--link",
                 rate, __file__, "--rank"], capture_output=True, text=True, env=env, timeout=600,
            )  # fmt: skip
            line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            if not line:
                sys.exit(done.stdout + done.stderr)
            runs.append(json.loads(line[0][7:]))
        from minipar.launcher.cluster import link

        bits = link.parse(rate)
        print(f"\nlink {rate}: ping-pong, min / median / max of {args.repeat} jobs")
        for where in ("inside", "across"):
            lat = [r[f"{where}.8"] for r in runs]
            print(f"  {where:6} 8 B latency: {spread(lat, 1e6)} us")
            for nbytes in SIZES[1:]:
                bw = [nbytes / r[f"{where}.{nbytes}"] / 1e9 for r in runs]
                share = (
                    ""
                    if where == "inside"
                    else f" ({spread([b * 8e9 / bits for b in bw], 100, '{:.0f}')} % of the link)"
                )  # noqa: E501
                print(f"  {where:6} {nbytes >> 20} MiB: {spread(bw)} GB/s{share}")


if __name__ == "__main__":
    rank_main() if "--rank" in sys.argv else main()
