"""All-reduce bench for scripts/gpu_check.sh, run on 2+ ranks: minipar's ring all-reduce of a
float32 tensor on each rank's device against torch.distributed (gloo, or NCCL when each rank owns
a GPU) on the same tensors, with the staging cost reported apart from the MPI time.

    minipar run -n 2 scripts/gpu_bench.py OUT.json [--iters N]

Per size (1 MiB, 64 MiB): seconds per all-reduce, min / median / max over the iterations, of
- minipar: the path the transport takes (direct, staged or staged-pipelined; host on CPU);
- minipar-oneshot: staging forced to one whole copy each way (MINIPAR_STAGE_CHUNK=0), the
  non-pipelined baseline (a GPU on a non-CUDA-aware MPI only);
- mpi-host: the same ring on pinned host memory: the MPI time alone, no copies;
- copies: device->host and host->device copies of the bytes this rank staged in one all-reduce
  (from the trace ledger), timed alone back to back: the staging cost if nothing overlapped;
- torch: torch.distributed.all_reduce on the same device tensors.
"""

import json
import statistics
import sys
import time

import torch

import minipar

SIZES = {"1 MiB": 1 << 20, "64 MiB": 64 << 20}


def timed(fn, iters, sync):
    for _ in range(2):  # warm up: pinned buffers, CUDA context, connections
        fn()
    out = []
    for _ in range(iters):
        minipar.barrier()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return {"min": min(out), "median": statistics.median(out), "max": max(out)}


def bench_size(nbytes, iters, dev, td, backend):
    w = minipar.init()
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    x = torch.ones(nbytes // 4, device=dev)
    row = {"bytes": nbytes, "ranks": w.size, "device": str(dev)}
    with minipar.trace() as t:
        minipar.all_reduce(x, algorithm="ring")
    row["path"] = ",".join(sorted(t.paths()))
    staged_out = sum(m.nbytes for m in t.messages if m.kind == "send" and m.path != "host")
    staged_in = sum(m.nbytes for m in t.messages if m.kind == "recv" and m.path != "host")
    row["minipar"] = timed(lambda: minipar.all_reduce(x, algorithm="ring"), iters, sync)
    if cuda and "staged-pipelined" in row["path"]:
        chunk, w._chunk = w._chunk, 0
        row["minipar-oneshot"] = timed(lambda: minipar.all_reduce(x, algorithm="ring"), iters, sync)
        w._chunk = chunk
    host = torch.ones(nbytes // 4, pin_memory=cuda)
    row["mpi-host"] = timed(lambda: minipar.all_reduce(host, algorithm="ring"), iters, sync)
    if cuda and staged_out:
        d2h = torch.empty(staged_out, dtype=torch.uint8, pin_memory=True)
        h2d = torch.empty(staged_in, dtype=torch.uint8, pin_memory=True)
        src = torch.empty(staged_out, dtype=torch.uint8, device=dev)
        dst = torch.empty(staged_in, dtype=torch.uint8, device=dev)

        def copies():
            d2h.copy_(src, non_blocking=True)
            dst.copy_(h2d, non_blocking=True)

        row["copies"] = timed(copies, iters, sync)
        row["copies_bytes"] = staged_out + staged_in
    try:
        row["torch"] = timed(lambda: td.all_reduce(x), iters, sync)
        row["torch_backend"] = f"{backend} on {dev.type}"
    except RuntimeError as error:  # a gloo without CUDA all-reduce: time it on host memory
        row["torch"] = timed(lambda: td.all_reduce(host), iters, sync)
        row["torch_backend"] = f"{backend} on cpu ({str(error).splitlines()[0][:60]})"
    mine, ref = row["minipar"]["median"], row["torch"]["median"]
    row["ratio_vs_torch"] = mine / ref if ref > 0 else None
    return row


def main():
    out = sys.argv[1]
    iters = int(sys.argv[sys.argv.index("--iters") + 1]) if "--iters" in sys.argv else 10
    import torch.distributed as td
    from mpi4py import MPI

    from minipar.comm.transport.torch import init_from_mpi

    w = minipar.init()
    dev = minipar.device()
    gpus = torch.cuda.device_count() if dev.type == "cuda" else 0
    backend = "nccl" if gpus >= w.size else "gloo"
    init_from_mpi(MPI.COMM_WORLD, backend=backend, timeout=120)
    rows = {name: bench_size(n, iters, dev, td, backend) for name, n in SIZES.items()}
    if w.rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f, indent=2)
    minipar.barrier()


if __name__ == "__main__":
    main()
