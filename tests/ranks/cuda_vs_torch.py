"""Every collective x algorithm on device tensors (minipar.device()) against torch.distributed on
the same tensors and against single-device math (run by scripts/gpu_check.sh).

The reference is NCCL when every rank has a GPU of its own, else gloo on the CUDA tensors; where
gloo has no CUDA kernel for a collective, gloo on CPU copies (the note file says which ran).
Inputs are small integers in float32, so every order of summation gives the exact same result:
all three must agree bit for bit."""

import contextlib
import functools
import importlib.util
import os

import torch

import minipar

_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda.py")
_spec = importlib.util.spec_from_file_location("ranks_cuda", _path)
cuda_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cuda_suite)

N = 1031


@functools.cache
def dist():
    """torch.distributed beside MPI in the same job: NCCL with a GPU per rank, else gloo."""
    import torch.distributed as td
    from mpi4py import MPI

    from minipar.comm.transport.torch import init_from_mpi

    w = minipar.init()
    dev = minipar.device()
    gpus = torch.cuda.device_count() if dev.type == "cuda" else 0
    backend = "nccl" if gpus >= w.size else "gloo"
    if not td.is_initialized():
        init_from_mpi(MPI.COMM_WORLD, backend=backend, timeout=60)
    return td, backend


def inputs(q, p, dtype=torch.float32):
    return cuda_suite.ints(q, p * N, dtype).to(minipar.device())


def expected(name, p, r):
    xs = [inputs(q, p) for q in range(p)]
    total = torch.stack(xs).sum(0)
    if name == "all_reduce":
        return total
    if name == "broadcast":
        return xs[p - 1]
    if name == "reduce":
        return total if r == 0 else None
    if name == "all_gather":
        return torch.cat(xs)
    if name == "reduce_scatter":
        return total[r * N : (r + 1) * N]
    if name == "all_to_all":
        return torch.cat([x.chunk(p)[r] for x in xs])
    if name == "scatter":
        return xs[0].chunk(p)[r]
    return torch.cat(xs) if r == 0 else xs[r]  # gather


def run_torch(td, name, x, p, r):
    if name == "all_reduce":
        td.all_reduce(x)
        return x
    if name == "broadcast":
        td.broadcast(x, src=p - 1)
        return x
    if name == "reduce":
        td.reduce(x, dst=0)
        return x
    if name == "all_gather":
        out = x.new_empty(p * len(x))
        td.all_gather_into_tensor(out, x)
        return out
    if name == "reduce_scatter":
        out = x.new_empty(N)
        td.reduce_scatter_tensor(out, x)
        return out
    if name == "all_to_all":
        out = torch.empty_like(x)
        td.all_to_all_single(out, x)
        return out
    if name == "scatter":
        out = x.new_empty(N)
        td.scatter(out, list(x.chunk(p)) if r == 0 else None, src=0)
        return out
    outs = [x.new_empty(len(x)) for _ in range(p)] if r == 0 else None
    td.gather(x, outs, dst=0)
    return torch.cat(outs) if r == 0 else x


def torch_reference(name, p, r):
    """(result, which backend on which memory ran it); gloo without a CUDA kernel for this
    collective raises on every rank alike, and then runs on CPU copies."""
    td, backend = dist()
    x = inputs(r, p)
    try:
        return run_torch(td, name, x, p, r), f"{backend} on {x.device.type}"
    except (RuntimeError, ValueError) as error:
        if backend != "gloo" or x.device.type != "cuda":
            raise
        note(f"{name}: gloo on CUDA tensors refused ({str(error).splitlines()[0][:80]})")
        return run_torch(td, name, x.cpu(), p, r).to(x.device), "gloo on cpu copies"


def note(line):
    folder = os.environ.get("MINIPAR_GPU_CHECK_NOTES")
    if folder and minipar.get_rank() == 0:
        with open(os.path.join(folder, "notes.txt"), "a") as f:
            f.write(line + "\n")


REDUCING = ("all_reduce", "reduce", "reduce_scatter")


@contextlib.contextmanager
def reductions_seen():
    """Every reduction kernel call's operand devices: they must all be the data's device (the
    sums run there, not on host copies)."""
    from minipar.collectives import reduce_op as ops

    seen, kernel = [], ops._reduce_torch

    def spy(dst, a, b, op):
        seen.append({str(dst.device), str(a.device), str(b.device)})
        return kernel(dst, a, b, op)

    ops._reduce_torch = spy
    try:
        yield seen
    finally:
        ops._reduce_torch = kernel


def check(name, algorithm):
    def case():
        w = minipar.init()
        p, r = w.size, w.rank
        want = expected(name, p, r)
        with minipar.trace() as t, reductions_seen() as seen:
            got = cuda_suite.run(name, algorithm, inputs(r, p), p, r, N, cpu=False)
        if name in REDUCING and p > 1:
            assert all(devs == {str(minipar.device())} for devs in seen), seen
            assert sum(w.allgather_object(len(seen))) > 0, "no rank reduced anything"
        if want is not None:
            assert got.device == want.device, (got.device, want.device)
            assert torch.equal(got, want), f"{name}/{algorithm}: minipar != single-device math"
        if algorithm == minipar.algorithms(name)[0]:  # torch once per collective, not per algo
            ref, how = torch_reference(name, p, r)
            if want is not None:
                assert torch.equal(ref, want), f"{name}: torch.distributed ({how}) != math"
            note(f"{name}: torch.distributed reference = {how}")
        note(f"{name}/{algorithm} p={p}: paths {t.paths()}")

    return case


def cases(size):
    return {
        f"{name}.{algorithm}": check(name, algorithm)
        for name in cuda_suite.COLLECTIVES
        for algorithm in minipar.algorithms(name)
    }
