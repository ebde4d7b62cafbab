"""The pipelined staged path on CPU ranks (run by tests/test_staging.py): CPU torch tensors are
forced through the same chunked code a CUDA tensor takes on a non-CUDA-aware MPI (plain copies
instead of a copy stream), so chunking, ordering, the size header and any-source receives run
under real MPI without a GPU. Also: each rank's device and local rank under mpiexec."""

import contextlib
import importlib.util
import os

import numpy as np
import pytest
import torch

import minipar
from minipar.errors import MessageSizeError
from minipar.runtime import devices

CHUNK = 1024  # bytes: every message of these cases is several chunks


def _load(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"ranks_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cuda_suite = _load("cuda")  # the collective driver the GPU suite uses


@contextlib.contextmanager
def chunked(comm, chunk=CHUNK):
    saved = comm._stage_host, comm._chunk
    comm._stage_host, comm._chunk = True, chunk
    try:
        yield
    finally:
        comm._stage_host, comm._chunk = saved


def collective(name, algorithm, dtype):
    def case():
        w = minipar.init()
        p, r, n = w.size, w.rank, 1031
        run, ints = cuda_suite.run, cuda_suite.ints
        plain = run(name, algorithm, ints(r, p * n, dtype), p, r, n, True)
        with chunked(w), minipar.trace() as t:
            staged = run(name, algorithm, ints(r, p * n, dtype), p, r, n, True)
        assert torch.equal(staged, plain), f"{name}/{algorithm}: chunked staging != plain"
        for m in t.messages:
            want = "staged-pipelined" if m.nbytes > CHUNK else "host"
            assert m.path == want, (m, want)
        if p > 1 and name != "broadcast" or r == p - 1:
            assert t.paths().get("staged-pipelined"), t.paths()

    return case


def any_source():
    w = minipar.init()
    if w.size < 2 or w.rank > 1:
        return
    n = 5000  # 20000 bytes: 20 chunks
    with chunked(w):
        if w.rank == 1:
            minipar.send(torch.arange(n, dtype=torch.float32), 0)
        else:
            got = torch.zeros(n)
            assert minipar.recv(got) == 1
            assert torch.equal(got, torch.arange(n, dtype=torch.float32))


def size_header():
    """A 3-chunk send into a 2-chunk receive: every chunk matches in size, the header does not."""
    w = minipar.init()
    if w.size < 2:
        return
    with chunked(w):
        if w.rank == 0:
            w.send(torch.ones(3 * CHUNK // 4), 1, tag=77)  # eager-sized chunks: the send ends
        elif w.rank == 1:
            with pytest.raises(MessageSizeError, match="expected 2048 bytes.*3072-byte"):
                w.recv(torch.zeros(2 * CHUNK // 4), 0, tag=77)
    minipar.barrier()


def one_end_chunked():
    """A chunked send into a plain receive: the receiver sees a message of the wrong size."""
    w = minipar.init()
    if w.size < 2:
        return
    if w.rank == 0:
        with chunked(w):
            w.send(torch.ones(3 * CHUNK // 4), 1, tag=78)
    elif w.rank == 1:
        with pytest.raises(MessageSizeError, match="expected 3072 bytes"):
            w.recv(torch.zeros(3 * CHUNK // 4), 0, tag=78)
    minipar.barrier()


def cpu_path_untouched():
    """Without the switch, CPU tensors and numpy arrays cross as one message each ('host')."""
    w = minipar.init()
    assert not w._stage_host
    with minipar.trace() as t:
        minipar.all_reduce(torch.ones(10000), algorithm="ring")
        minipar.all_reduce(np.ones(10000), algorithm="ring")
    assert set(t.paths()) <= {"host"}, t.paths()


def device_on_cpu():
    w = minipar.init()
    assert minipar.device() == torch.device("cpu")
    # one node: the launcher's local rank is the world rank, and MPI's shared-memory split agrees
    assert minipar.local_rank() == w.rank
    assert devices.local_rank_from_env(os.environ)[0] == w.rank
    assert devices._shared_memory_rank(w) == (w.rank, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)")


def cases(size):
    table = {
        "any_source": any_source,
        "size_header": size_header,
        "one_end_chunked": one_end_chunked,
        "cpu_path_untouched": cpu_path_untouched,
        "device_on_cpu": device_on_cpu,
    }
    for name in cuda_suite.COLLECTIVES:
        for algorithm in minipar.algorithms(name):
            table[f"{name}.{algorithm}"] = collective(name, algorithm, torch.float32)
    return table
