"""The single-copy shared-memory transport (minipar/comm/transport/shm.py,
collectives/fast/windows.py) on real ranks: the collectives matrix's cases (numpy references,
bitwise identity, every dtype and op) forced onto the windows with `algorithm="ring@shm"`, pieces
and blocks, sub-groups, async calls in flight with blocking ones, the transport switch, and waits
that time out or catch a mismatched call, naming the collective and the peer.
"""

import os

import numpy as np
from collectives import kinds_dtypes, large_case, moving_case, reducing_case, same_everywhere

import minipar
from minipar.comm.transport import shm
from minipar.errors import CommTimeoutError, MismatchError

SHM = ["all_reduce", "all_gather", "reduce_scatter"]


def world():
    return minipar.init()


def trace_algorithm(fn) -> str:
    with minipar.trace() as t:
        fn()
    return t.calls[-1].algorithm


def pieces_case():
    """Segments smaller than the message (several rounds), blocks smaller than a segment, on a
    fresh group (its window starts small); uneven sizes; results bitwise identical."""
    w = world()
    p, r = w.size, w.rank
    saved = shm.MAX_SEGMENT, shm.BLOCK_BYTES
    shm.MAX_SEGMENT, shm.BLOCK_BYTES = 1 << 16, 1 << 12
    try:
        g = minipar.new_group(list(range(p)))
        n = 3 * (1 << 14) + 5  # 192 KiB + 20 bytes of float32: three-plus segments
        x = np.arange(n, dtype=np.float32) * (r + 1)
        minipar.all_reduce(x, group=g, algorithm="ring@shm")
        assert np.array_equal(x, np.arange(n, dtype=np.float32) * (p * (p + 1) // 2))
        same_everywhere(x, "pieces all_reduce")
        out = np.empty(p * n, np.float32)
        mine = np.full(n, r, np.float32)
        minipar.all_gather_into_tensor(out, mine, group=g, algorithm="ring@shm")
        assert (out.reshape(p, n) == np.arange(p)[:, None]).all()
        inp = np.repeat(np.arange(p, dtype=np.float32), n) + r
        mine = np.empty(n, np.float32)
        minipar.reduce_scatter_tensor(mine, inp, group=g, algorithm="ring@shm")
        assert (mine == p * r + p * (p - 1) // 2).all()
        in_place = inp.copy()  # output inside the input: the in-place form
        minipar.reduce_scatter_tensor(in_place[r * n : (r + 1) * n], in_place, group=g,
                                      algorithm="ring@shm")  # fmt: skip
        assert (in_place[r * n : (r + 1) * n] == mine).all()
    finally:
        shm.MAX_SEGMENT, shm.BLOCK_BYTES = saved


def sub_groups_case():
    """Evens and odds each use their own windows at once; the world's are untouched."""
    w = world()
    if w.size < 2:
        return
    evens, odds = list(range(0, w.size, 2)), list(range(1, w.size, 2))
    ge, go = minipar.new_group(evens), minipar.new_group(odds)
    mine = ge if w.rank % 2 == 0 else go
    ranks = evens if w.rank % 2 == 0 else odds
    x = np.full(1 << 16, float(w.rank))
    minipar.all_reduce(x, group=mine, algorithm="ring@shm")
    assert (x == sum(ranks)).all()
    y = np.ones(1000)
    minipar.all_reduce(y, algorithm="ring@shm")
    assert (y == w.size).all()


def async_case():
    """An async call on the progress thread and blocking calls after it, all on the windows:
    they run in the order issued, on every rank."""
    w = world()
    p = w.size
    a, b = np.ones(1 << 18, np.float32), np.full(1 << 10, 2.0, np.float32)
    work = minipar.all_reduce(a, algorithm="ring@shm", async_op=True)
    minipar.all_reduce(b, algorithm="rabenseifner@shm")
    out = np.empty(p * 100, np.float32)
    minipar.all_gather_into_tensor(out, np.full(100, w.rank, np.float32), algorithm="ring@shm")
    work.wait()
    assert (a == p).all() and (b == 2 * p).all()
    assert (out.reshape(p, 100) == np.arange(p)[:, None]).all()


def switch_case():
    """MINIPAR_TRANSPORT and @transport decide, and the trace shows it."""
    x = np.ones(4, np.float32)
    saved = os.environ.get("MINIPAR_TRANSPORT")
    try:
        os.environ["MINIPAR_TRANSPORT"] = "shm"
        assert trace_algorithm(lambda: minipar.all_reduce(x, algorithm="ring")) == "ring@shm"
        assert trace_algorithm(lambda: minipar.all_reduce(x, algorithm="tree")) == "tree@shm"
        assert trace_algorithm(lambda: minipar.broadcast(x, 0, algorithm="ring")) == "ring"
        os.environ["MINIPAR_TRANSPORT"] = "mpi"
        big = np.ones(1 << 22, np.float32)
        assert trace_algorithm(lambda: minipar.all_reduce(big, algorithm="ring")) == "ring"
        assert trace_algorithm(lambda: minipar.all_reduce(x, algorithm="ring@shm")) == "ring@shm"
        os.environ["MINIPAR_TRANSPORT"] = "carrier-pigeon"
        try:
            minipar.all_reduce(x)
        except ValueError as error:
            assert "MINIPAR_TRANSPORT" in str(error) and "carrier-pigeon" in str(error)
        else:
            raise AssertionError("a bad MINIPAR_TRANSPORT was accepted")
    finally:
        os.environ.pop("MINIPAR_TRANSPORT", None)
        if saved is not None:
            os.environ["MINIPAR_TRANSPORT"] = saved
    try:
        minipar.broadcast(x, 0, algorithm="ring@shm")
    except ValueError as error:
        assert "broadcast" in str(error), error
    else:
        raise AssertionError("broadcast over shared memory was accepted")
    try:
        minipar.all_reduce(x, algorithm="ring@tcp")
    except ValueError as error:
        assert "tcp" in str(error), error
    else:
        raise AssertionError("an unknown @transport was accepted")


def timeout_case():
    """Rank 1 comes late: rank 0's wait times out naming the collective and rank 1, within the
    group's timeout; the late rank then times out naming rank 0."""
    w = world()
    if w.size < 2:
        return
    g = minipar.new_group([0, 1], timeout=0.5)
    pair = minipar.new_group([0, 1])  # the default timeout: for lining the two ranks up
    if w.rank > 1:
        return
    x = np.ones(1 << 12, np.float32)
    minipar.all_reduce(x, group=g, algorithm="ring@shm")  # both here: the windows exist
    if w.rank == 1:
        pair.barrier()
    try:
        minipar.all_reduce(x, group=g, algorithm="ring@shm")
    except CommTimeoutError as error:
        message = str(error)
    else:
        raise AssertionError("no timeout")
    peer = 1 - w.rank
    assert "all_reduce (algorithm ring@shm)" in message and f"rank {peer}" in message, message
    assert "timed out after 0.5 s" in message, message
    if w.rank == 0:
        pair.barrier()


def mismatch_case():
    """Two ranks in different calls with the same byte count: both raise MismatchError naming
    the other rank, instead of mixing an all-gather's bytes into an all-reduce."""
    w = world()
    if w.size < 2:
        return
    g = minipar.new_group([0, 1], timeout=5)
    if w.rank > 1:
        return
    try:
        if w.rank == 0:
            minipar.all_reduce(np.ones(64, np.float32), group=g, algorithm="ring@shm")
        else:
            out = np.empty(64, np.float32)
            minipar.all_gather_into_tensor(out, np.ones(32, np.float32), group=g,
                                           algorithm="ring@shm")  # fmt: skip
    except MismatchError as error:
        assert f"rank {1 - w.rank}" in str(error), error
    else:
        raise AssertionError("the mismatched calls were not caught")


SPREAD = [("numpy", "float64"), ("torch", "bfloat16"), ("numpy", "int8"), ("numpy", "bool")]


def dtypes(collective, size):
    """Every dtype for all-reduce on 2 and 3 ranks; a spread of kinds and widths elsewhere (the
    windows move bytes: dtypes differ only in the reduction, which ops.py shares with MPI's
    path), unless MINIPAR_EXTENDED=1."""
    if os.environ.get("MINIPAR_EXTENDED") == "1" or (collective == "all_reduce" and size <= 3):
        return kinds_dtypes(size)
    return SPREAD


def cases(size):
    table = {}
    for collective in SHM:
        maker = moving_case if collective == "all_gather" else reducing_case
        for kind, dtype in dtypes(collective, size):
            table[f"{collective}.{kind}_{dtype}"] = maker(collective, "ring@shm", kind, dtype)
        table[f"{collective}.large_4MiB"] = large_case(collective, "ring@shm")
    table["all_reduce.rabenseifner.large_4MiB"] = large_case("all_reduce", "rabenseifner@shm")
    table["pieces"] = pieces_case
    table["sub_groups"] = sub_groups_case
    table["async"] = async_case
    table["switch"] = switch_case
    table["timeout"] = timeout_case
    table["mismatch"] = mismatch_case
    return table
