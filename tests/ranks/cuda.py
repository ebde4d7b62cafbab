"""CUDA tensors through minipar (run by tests/test_cuda.py and scripts/gpu_check.sh on a GPU).

Every rank uses minipar.device() (its local rank modulo the GPUs; the CPU in
`scripts/gpu_check.sh --cpu-dry-run`, which proves the driver, not the GPU path). Each case runs
a collective on CUDA tensors and on CPU copies of the same inputs and requires identical
results (integer-valued inputs, exact in any order), and checks the MPI transport's CUDA path:
direct when the MPI is CUDA-aware, staged through pinned host memory otherwise
(MINIPAR_CUDA_AWARE=0 forces staging)."""

import numpy as np
import torch

import minipar

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64]


def device():
    minipar.init()
    return minipar.device()


def ints(rank, n, dtype, salt=0):
    rng = np.random.default_rng(31 * rank + n + salt)
    return torch.from_numpy(rng.integers(-8, 8, n)).to(dtype)


def ping_pong(dtype):
    def case():
        w = minipar.init()
        if w.size < 2 or w.rank > 1:
            return
        x = ints(0, 4099, dtype).to(device())
        if w.rank == 0:
            w.send(x, 1)
            back = torch.zeros_like(x)
            w.recv(back, 1)
            assert torch.equal(back.cpu(), ints(0, 4099, dtype) * 2)
        else:
            got = torch.zeros_like(x)
            w.recv(got, 0)
            w.send(got * 2, 0)

    return case


def collective(name, algorithm, dtype):
    def case():
        w = minipar.init()
        p, r = w.size, w.rank
        n = 1031
        run(name, algorithm, ints(r, p * n, dtype), p, r, n, cpu=True)
        on_gpu = run(name, algorithm, ints(r, p * n, dtype).to(device()), p, r, n, cpu=False)
        on_cpu = run(name, algorithm, ints(r, p * n, dtype), p, r, n, cpu=True)
        assert on_gpu.device == device() or name == "reduce" and r != 0
        assert torch.equal(on_gpu.cpu(), on_cpu), f"{name}/{algorithm} {dtype}: GPU != CPU"

    return case


def run(name, algorithm, x, p, r, n, cpu):
    a = algorithm
    if name == "all_reduce":
        minipar.all_reduce(x, algorithm=a)
        return x
    if name == "broadcast":
        minipar.broadcast(x, p - 1, algorithm=a)
        return x
    if name == "reduce":
        minipar.reduce(x, 0, algorithm=a)
        return x
    if name == "all_gather":
        out = x.new_empty(p * len(x))
        minipar.all_gather_into_tensor(out, x, algorithm=a)
        return out
    if name == "reduce_scatter":
        out = x.new_empty(n)
        minipar.reduce_scatter_tensor(out, x, algorithm=a)
        return out
    if name == "all_to_all":
        out = torch.empty_like(x)
        minipar.all_to_all_single(out, x, algorithm=a)
        return out
    if name == "scatter":
        out = x.new_empty(n)
        minipar.scatter(out, list(x.chunk(p)) if r == 0 else None, 0, algorithm=a)
        return out
    outs = [x.new_empty(len(x)) for _ in range(p)] if r == 0 else None
    minipar.gather(x, outs, 0, algorithm=a)
    return torch.cat(outs) if r == 0 else x


COLLECTIVES = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "scatter",
    "gather",
]


def cases(size):
    table = {f"ping_pong_{str(d)[6:]}": ping_pong(d) for d in DTYPES}
    for name in COLLECTIVES:
        for algorithm in minipar.algorithms(name):
            for dtype in (torch.float32, torch.bfloat16, torch.int64):
                table[f"{name}.{algorithm}.{str(dtype)[6:]}"] = collective(name, algorithm, dtype)
    return table
