"""torch.distributed parity, run on every rank (see minipar.testing): programs in the style of
PyTorch's distributed tutorial, each written ONCE as a function of a `dist` module, run with
torch.distributed (gloo) and then with `import minipar as dist` in the same processes; results
must be equal (exactly, but for the SGD program: gloo and minipar add three ranks' gradients in
different orders, so its weights agree to float32 rounding).

Under mpiexec the gloo group is brought up inside the MPI job (same rank numbering) and minipar
runs on MPI; under torch.multiprocessing.spawn minipar runs over that same gloo group (the torch
transport). The bad-input cases (`bad.*`, listed in docs/errors.md) follow tests/ranks/
reliability.py: same error on every rank, nothing moved, the group still works.
"""

import functools
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from reliability import bad_case

import minipar


@functools.cache
def gloo():
    import torch.distributed as dist

    if not dist.is_initialized():
        from mpi4py import MPI

        from minipar.comm.transport.torch import init_from_mpi

        init_from_mpi(MPI.COMM_WORLD)
    return dist


def members(size):
    """A sub-group whose group ranks differ from its global ranks when there are 3 ranks."""
    return list(range(1, size)) if size > 2 else [0, 1]


# -- the programs: each takes `dist` (torch.distributed or minipar) ----------------------------
def blocking_p2p(dist):
    """The tutorial's first program: rank 0 sends a tensor, the others receive it."""
    rank, size = dist.get_rank(), dist.get_world_size()
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        for q in range(1, size):
            dist.send(tensor=tensor, dst=q)
    else:
        dist.recv(tensor=tensor, src=0)
    return tensor


def any_source(dist):
    """recv(src=None) takes whichever rank's message comes first and says who sent it."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank != 0:
        dist.send(torch.full((2,), float(rank)), dst=0, tag=3)
        return None
    got = {}
    for _ in range(size - 1):
        t = torch.zeros(2)
        sender = dist.recv(t, tag=3)
        got[sender] = t
    return got


def nonblocking_p2p(dist):
    """The tutorial's isend / irecv, with the Work's wait() and is_completed()."""
    rank, size = dist.get_rank(), dist.get_world_size()
    tensor = torch.zeros(1)
    done = []
    if rank == 0:
        tensor += 1
        reqs = [dist.isend(tensor=tensor, dst=q) for q in range(1, size)]
        for req in reqs:
            req.wait()
            done.append(req.is_completed())
    else:
        req = dist.irecv(tensor=tensor, src=0)
        req.wait()
        done.append(req.is_completed())
    return tensor, done


def group_all_reduce(dist):
    """The tutorial's group all-reduce, and the group's rank translations."""
    rank, size = dist.get_rank(), dist.get_world_size()
    ranks = members(size)
    group = dist.new_group(ranks)
    tensor = torch.ones(1) * (rank + 1)
    facts = None
    if rank in ranks:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        facts = (
            dist.get_rank(group),
            dist.get_world_size(group),
            dist.get_process_group_ranks(group),
            dist.get_group_rank(group, ranks[-1]),
            dist.get_global_rank(group, 0),
        )
    world = torch.full((3,), float(rank))
    dist.all_reduce(world, group=dist.group.WORLD, op=dist.ReduceOp.MAX)
    dist.barrier()
    return tensor, facts, world, dist.is_initialized()


def group_roots(dist):
    """Rooted tensor collectives on a sub-group with torch's group_src / group_dst keywords."""
    rank, size = dist.get_rank(), dist.get_world_size()
    ranks = members(size)
    group = dist.new_group(ranks)
    if rank not in ranks:
        return None
    t = torch.full((2,), float(rank))
    dist.broadcast(t, group_src=1, group=group)
    r = torch.full((2,), float(rank + 1))
    dist.reduce(r, group_dst=0, group=group)
    return t, r if dist.get_rank(group) == 0 else None


def outside_group(dist):
    """Every rank makes the calls on a sub-group, the one outside it too (on 3 ranks): torch's
    rule, for the outsider nothing happens and None comes back (recv: -1), with a warning."""
    rank, size = dist.get_rank(), dist.get_world_size()
    ranks = members(size)
    group = dist.new_group(ranks)
    x = torch.full((2,), float(rank + 1))
    out = [torch.zeros(2) for _ in ranks]
    objs = [None] * len(ranks)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        returned = [
            dist.all_reduce(x, group=group),
            dist.broadcast(x, group_src=0, group=group),
            dist.all_gather(out, x, group=group),
            dist.all_gather_object(objs, rank, group=group),
            dist.barrier(group=group),
        ]
        if rank not in ranks:
            returned += [dist.isend(x, dst=ranks[0], group=group), dist.irecv(x, group=group)]
    return returned, x, out, objs, rank not in ranks and len(seen) >= len(returned)


def average_gradients(model, dist):
    """The tutorial's gradient averaging."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def sgd(dist):
    """The tutorial's synchronous SGD: same start on every rank, own data, averaged gradients."""
    rank = dist.get_rank()
    torch.manual_seed(1234)
    model = torch.nn.Linear(4, 1)
    data = torch.randn(16, 4, generator=torch.Generator().manual_seed(rank))
    target = data.sum(1, keepdim=True)
    for _epoch in range(2):
        for i in range(0, 16, 4):
            loss = F.mse_loss(model(data[i : i + 4]), target[i : i + 4])
            loss.backward()
            average_gradients(model, dist)
            with torch.no_grad():  # optim.SGD's step, by hand (torch.optim is slow to import)
                for param in model.parameters():
                    param -= 0.1 * param.grad
                    param.grad = None
    return [p.detach().clone() for p in model.parameters()]


def ring_all_reduce(dist):
    """The tutorial's user-written ring all-reduce on isend / recv."""
    rank, size = dist.get_rank(), dist.get_world_size()
    send = torch.arange(6, dtype=torch.float32) + 10 * rank
    send_buff, recv_buff, accum = send.clone(), send.clone(), send.clone()
    left, right = (rank - 1 + size) % size, (rank + 1) % size
    for i in range(size - 1):
        if i % 2 == 0:
            send_req = dist.isend(send_buff, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            send_req = dist.isend(recv_buff, right)
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    return accum


def batch_p2p(dist):
    """batch_isend_irecv's example (a ring shift), then a shift with tags in reverse."""
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1 + size) % size
    send = torch.arange(2, dtype=torch.float32) + 2 * rank
    recv = torch.zeros(2, dtype=torch.float32)
    ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    back = torch.zeros(3, dtype=torch.int64)
    ops = [
        dist.P2POp(dist.irecv, back, right, tag=7),
        dist.P2POp(dist.isend, torch.full((3,), rank, dtype=torch.int64), left, tag=7),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return recv, back


def group_p2p(dist):
    """Point-to-point on a sub-group: global dst/src, and group_dst / group_src."""
    rank, size = dist.get_rank(), dist.get_world_size()
    ranks = members(size)
    group = dist.new_group(ranks)
    if rank not in ranks:
        return None
    me = dist.get_rank(group)
    a, b = torch.full((3,), float(rank)), torch.zeros(3)
    if me == 0:
        dist.send(a, group=group, group_dst=1, tag=5)
        dist.send(a * 2, dst=ranks[1], group=group, tag=6)
        return None
    if me == 1:
        first = dist.recv(b, group=group, group_src=0, tag=5)
        c = torch.zeros(3)
        second = dist.recv(c, src=ranks[0], group=group, tag=6)
        return first, b, second, c
    return None


def objects(dist):
    """The four object collectives, on the world and (broadcast) on a sub-group."""
    rank, size = dist.get_rank(), dist.get_world_size()
    everyone = [None] * size
    dist.all_gather_object(everyone, {"rank": rank, "text": "x" * (50 * rank), "l": [rank] * rank})
    objs = [{"a": 1}, "two", [3] * 100] if rank == 0 else [None, None, None]
    dist.broadcast_object_list(objs, src=0)
    gathered = [None] * size if rank == size - 1 else None
    dist.gather_object(("hi", rank), gathered, dst=size - 1)
    inputs = [{"to": q, "pad": "y" * (30 * q)} for q in range(size)] if rank == 0 else None
    mine = [None]
    dist.scatter_object_list(mine, inputs, src=0)
    ranks = members(size)
    group = dist.new_group(ranks)
    sub = [None, None]
    if rank in ranks:
        sub = [f"from {rank}", rank] if rank == ranks[-1] else [None, None]
        dist.broadcast_object_list(sub, src=ranks[-1], group=group)
    return everyone, objs, gathered, mine, sub


def lists(dist):
    """List forms and split sizes, blocking and async: all_to_all (equal sizes: gloo's list
    all-to-all needs them), all_to_all_single with unequal splits, reduce_scatter, all_gather."""
    rank, size = dist.get_rank(), dist.get_world_size()
    inputs = [torch.full((2, 2), float(10 * rank + j)) for j in range(size)]
    outputs = [torch.zeros(2, 2) for _ in range(size)]
    dist.all_to_all(outputs, inputs)
    outputs2 = [torch.zeros(2, 2) for _ in range(size)]
    dist.all_to_all(outputs2, inputs, async_op=True).wait()
    x, y, y2 = uneven_single_inputs(rank, size)
    dist.all_to_all_single(y, x, [rank + 1] * size, [j + 1 for j in range(size)])
    dist.all_to_all_single(
        y2, x, [rank + 1] * size, [j + 1 for j in range(size)], async_op=True
    ).wait()
    z = torch.zeros(3 * size, dtype=torch.int64)
    dist.all_to_all_single(z, torch.arange(3 * size) + 100 * rank)
    out = torch.zeros(3, dtype=torch.int64)
    dist.reduce_scatter(out, [torch.full((3,), rank * size + j) for j in range(size)])
    out2 = torch.zeros(2)
    work = dist.reduce_scatter(
        out2,
        [torch.full((2,), float(j + rank)) for j in range(size)],
        op=dist.ReduceOp.MAX,
        async_op=True,
    )
    work.wait()
    gathered = [torch.zeros(2) for _ in range(size)]
    dist.all_gather(gathered, torch.full((2,), float(rank)))
    return outputs, outputs2, y, y2, z, out, out2, gathered


def uneven_single_inputs(rank, size):
    """Rank r sends j + 1 rows (of 2) to rank j, so rank j receives j + 1 rows from each."""
    x = torch.arange(size * (size + 1), dtype=torch.float32).reshape(-1, 2) + 100 * rank
    return x, torch.zeros(size * (rank + 1), 2), torch.zeros(size * (rank + 1), 2)


def bitwise(dist):
    """ReduceOp.BAND / BOR / BXOR on integer and bool tensors."""
    rank = dist.get_rank()
    results = []
    for name in ("BAND", "BOR", "BXOR"):
        op = getattr(dist.ReduceOp, name)
        for dtype in (torch.int32, torch.int64, torch.uint8, torch.bool):
            x = torch.tensor([rank + 1, 6, 1 << rank, 255 - rank, 0, 1]).to(dtype)
            dist.all_reduce(x, op=op)
            results.append(x)
    return results


PROGRAMS = [
    blocking_p2p,
    any_source,
    nonblocking_p2p,
    group_all_reduce,
    group_roots,
    outside_group,
    sgd,
    ring_all_reduce,
    batch_p2p,
    group_p2p,
    objects,
    lists,
    bitwise,
]


def same(ours, ref, what, exact=True):
    """Equal values of the same structure; tensors of the same dtype and shape."""
    if isinstance(ref, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{what}: {type(ours)} vs tensor"
        assert ours.dtype == ref.dtype and ours.shape == ref.shape, f"{what}: {ours} vs {ref}"
        ok = torch.equal(ours, ref) if exact else torch.allclose(ours, ref, rtol=1e-5, atol=1e-6)
        assert ok, f"{what}: minipar {ours} != torch {ref}"
    elif isinstance(ref, (list, tuple)):
        assert type(ours) is type(ref) and len(ours) == len(ref), f"{what}: {ours!r} vs {ref!r}"
        for i, (a, b) in enumerate(zip(ours, ref)):
            same(a, b, f"{what}[{i}]", exact)
    elif isinstance(ref, dict):
        assert sorted(ours) == sorted(ref), f"{what}: keys {sorted(ours)} vs {sorted(ref)}"
        for k in ref:
            same(ours[k], ref[k], f"{what}[{k!r}]", exact)
    else:
        assert ours == ref, f"{what}: minipar {ours!r} != torch {ref!r}"


def parity_case(program):
    def case():
        minipar.init()
        ref = program(gloo())
        gloo().barrier()  # any-source receives must not take the other run's messages
        ours = program(minipar)
        same(ours, ref, program.__name__, exact=program is not sgd)

    return case


# -- minipar-only: the algorithms behind the list forms, bitwise ops, traces ------------------
def uneven_all_to_all_case():
    """all_to_all with tensors of different sizes (gloo's list form refuses them) equals gloo's
    all_to_all_single with the same splits, for every all-to-all algorithm, blocking and async."""
    minipar.init()
    dist = gloo()
    rank, size = dist.get_rank(), dist.get_world_size()
    x, ref, _ = uneven_single_inputs(rank, size)
    dist.all_to_all_single(ref, x, [rank + 1] * size, [j + 1 for j in range(size)])
    for algorithm in minipar.algorithms("all_to_all"):
        for async_op in (False, True):
            inputs = list(x.split([j + 1 for j in range(size)]))
            outputs = [torch.zeros(rank + 1, 2) for _ in range(size)]
            work = minipar.all_to_all(outputs, inputs, algorithm=algorithm, async_op=async_op)
            if async_op:
                work.wait()
            same(torch.cat(outputs), ref, f"all_to_all {algorithm} async={async_op}")
            y = torch.zeros_like(ref)
            splits = ([rank + 1] * size, [j + 1 for j in range(size)])
            minipar.all_to_all_single(y, x, *splits, algorithm=algorithm)
            same(y, ref, f"all_to_all_single {algorithm}")
    # numpy, empty blocks, splits in rows of a 2-D array
    inp = np.arange(3 * size * size, dtype=np.int16).reshape(-1, 3)[: size * (size - 1) // 2]
    out_rows = [rank] * size  # rank j gets j rows from each: rank r sends j rows to rank j
    out = np.zeros((size * rank, 3), dtype=np.int16)
    minipar.all_to_all_single(out, np.ascontiguousarray(inp), out_rows, list(range(size)))
    want = np.concatenate([inp[sum(range(rank)) : sum(range(rank + 1))]] * size)
    assert np.array_equal(out, want.reshape(out.shape)), (out, want)


def bitwise_algorithms_case():
    """BAND / BOR / BXOR through every all-reduce and reduce-scatter algorithm, numpy and torch,
    against numpy's reduction of every rank's input. The kernels do not depend on the transport:
    MPI only, to keep the torch-transport run short."""
    w = minipar.init()
    if minipar.get_backend() != "mpi":
        return
    p, r = w.size, w.rank
    parts = [np.random.default_rng(q).integers(-(2**30), 2**30, 2 * p) for q in range(p)]
    for op, ufunc in (
        (minipar.ReduceOp.BAND, np.bitwise_and),
        (minipar.ReduceOp.BOR, np.bitwise_or),
        (minipar.ReduceOp.BXOR, np.bitwise_xor),
    ):
        want = functools.reduce(ufunc, parts).astype(np.int32)
        for algorithm in minipar.algorithms("all_reduce"):
            x = parts[r].astype(np.int32)
            minipar.all_reduce(x, op=op, algorithm=algorithm)
            assert np.array_equal(x, want), (op, algorithm, x, want)
            t = torch.from_numpy(parts[r] % 2 == 1)
            minipar.all_reduce(t, op=op, algorithm=algorithm)
            bools = functools.reduce(ufunc, [q % 2 == 1 for q in parts])
            assert np.array_equal(t.numpy(), bools), (op, algorithm, "bool")
        for algorithm in minipar.algorithms("reduce_scatter"):
            out = np.zeros(2, dtype=np.int32)
            minipar.reduce_scatter_tensor(
                out, parts[r].astype(np.int32), op=op, algorithm=algorithm
            )
            assert np.array_equal(out, want[2 * r : 2 * r + 2]), (op, algorithm, out)


def traced_case():
    """The ledger sees point-to-point messages (collective "p2p") and the object and list
    collectives as the tensor collectives they run."""
    w = minipar.init()
    p, r = w.size, w.rank
    x = np.zeros(5, dtype=np.float64)
    with minipar.trace() as t:
        reqs = [minipar.isend(x + r, dst=(r + 1) % p), minipar.irecv(x, src=(r - 1) % p)]
        for req in reqs:
            req.wait()
    assert t.bytes_sent("p2p") == 40 and t.bytes_received("p2p") == 40, t.messages
    assert (x == (r - 1) % p).all(), x
    with minipar.trace() as t:
        minipar.all_gather_object([None] * p, r)
        minipar.all_to_all([np.zeros(1)] * p, [np.ones(1)] * p)
        minipar.reduce_scatter(np.zeros(1), [np.ones(1)] * p)
    assert [c.collective for c in t.calls] == ["all_gather"] * 2 + ["all_to_all", "reduce_scatter"]


def p2p_timeout_case():
    """A receive nobody answers times out within the group's timeout, naming peer and tag; an
    any-source one says "any rank". MPI only: a pending gloo receive cannot be withdrawn."""
    w = minipar.init()
    if minipar.get_backend() != "mpi":
        return
    g = minipar.new_group(list(range(w.size)), name="quiet")
    g.timeout = 0.3
    if w.rank == 0:
        for src, words in ((1, "recv of 16 bytes from rank 1 (tag 9)"), (None, "any rank (tag 9)")):
            try:
                minipar.recv(np.zeros(2), src=src, group=g, tag=9)
            except minipar.CommTimeoutError as error:
                assert words in str(error) and "group quiet" in str(error), str(error)
            else:
                raise AssertionError("no CommTimeoutError")
    minipar.barrier()


UNPICKLABLE = {}


def unpickle(make):
    UNPICKLABLE[make.__name__] = make
    return make


def a_lock():
    import threading

    return threading.Lock()


@unpickle
def object_all_gather_unpicklable(w):
    obj = (lambda: 1) if w.rank == w.size - 1 else 1
    return lambda: minipar.all_gather_object([None] * w.size, obj), "builtins.function"


@unpickle
def object_gather_unpicklable(w):
    obj = a_lock() if w.rank == w.size - 1 else "fine"
    return lambda: minipar.gather_object(obj, [None] * w.size if w.rank == 0 else None), "lock"


@unpickle
def object_broadcast_unpicklable(w):
    objs = [1, a_lock()] if w.rank == 0 else [None, None]
    return lambda: minipar.broadcast_object_list(objs, src=0), "object_list[1] of type _thread"


@unpickle
def object_scatter_unpicklable(w):
    objs = [1] * (w.size - 1) + [lambda: 2] if w.rank == 0 else None
    where = f"scatter_object_input_list[{w.size - 1}] of type builtins.function"
    return lambda: minipar.scatter_object_list([None], objs, src=0), where


def unpicklable_case(make):
    """Every rank raises the same TypeError naming the object's type; the group still works."""

    def case():
        w = minipar.init()
        call, fragment = make(w)
        try:
            call()
        except TypeError as error:
            message = str(error)
        else:
            raise AssertionError("no TypeError raised")
        assert fragment in message and "cannot be pickled" in message, message
        everyone = w.allgather_object(message)
        assert len(set(everyone)) == 1, everyone
        out = [None] * w.size
        minipar.all_gather_object(out, w.rank)
        assert out == list(range(w.size)), out

    return case


# -- bad input: checked before any byte moves (docs/errors.md) -------------------------------
BAD = {}


def bad(error, fragment, who="all"):
    def register(make):
        make.error, make.fragment, make.who = error, fragment, who
        BAD[make.__name__] = make
        return make

    return register


def t4():
    return torch.zeros(4)


@bad(ValueError, "pass dst (a global rank) or group_dst (a rank in the group), not both")
def p2p_dst_and_group_dst(w):
    return lambda: minipar.send(t4(), dst=0, group_dst=0)


@bad(ValueError, "dst is missing: pass dst (a global rank) or group_dst")
def p2p_dst_missing(w):
    return lambda: minipar.isend(t4())


@bad(ValueError, "is not a global rank in group world (its global ranks: [0, 1")
def p2p_dst_not_in_group(w):
    return lambda: minipar.send(t4(), dst=w.size)


@bad(ValueError, "is not a rank of group world (group size")
def p2p_group_src_out_of_range(w):
    return lambda: minipar.irecv(t4(), group_src=-1)


@bad(ValueError, "invalid destination rank: it is the calling rank itself")
def p2p_send_to_self(w):
    return lambda: minipar.send(t4(), dst=w.rank)


@bad(ValueError, "tag -1 must be an int in [0, 32768)")
def p2p_tag_negative(w):
    return lambda: minipar.send(t4(), dst=(w.rank + 1) % w.size, tag=-1)


@bad(ValueError, "tensor is a read-only numpy array; it must be writable")
def p2p_recv_read_only(w):
    x = np.zeros(4)
    x.flags.writeable = False
    return lambda: minipar.recv(x, src=(w.rank + 1) % w.size)


@bad(TypeError, "tensor must be a numpy.ndarray or torch.Tensor, got builtins.list")
def p2p_not_a_tensor(w):
    return lambda: minipar.isend([1.0, 2.0], dst=0)


@bad(ValueError, "P2POp's op must be minipar.isend or minipar.irecv")
def p2pop_bad_op(w):
    return lambda: minipar.P2POp(minipar.send, t4(), 0)


@bad(ValueError, "batch_isend_irecv takes a non-empty list of minipar.P2POp")
def batch_empty(w):
    return lambda: minipar.batch_isend_irecv([])


@bad(ValueError, "batch_isend_irecv: all ops must use the same group")
def batch_mixed_groups(w):
    g = minipar.new_group(list(range(w.size)))
    peer = (w.rank + 1) % w.size
    ops = [minipar.P2POp(minipar.isend, t4(), peer), minipar.P2POp(minipar.irecv, t4(), peer, g)]
    return lambda: minipar.batch_isend_irecv(ops)


@bad(ValueError, "object_list must be a list of")
def object_list_wrong_length(w):
    return lambda: minipar.all_gather_object([None] * (w.size + 1), 1)


@bad(ValueError, "object_gather_list must be a list of", who="root")
def object_gather_list_missing_on_dst(w):
    return lambda: minipar.gather_object(1, None, dst=0)


@bad(ValueError, "scatter_object_output_list must be a list of at least one entry")
def object_scatter_output_empty(w):
    return lambda: minipar.scatter_object_list([], [1] * w.size if w.rank == 0 else None)


@bad(ValueError, "pass src (a global rank) or group_src (a rank in the group), not both")
def object_src_and_group_src(w):
    return lambda: minipar.broadcast_object_list([1], src=0, group_src=0)


@bad(ValueError, "input_tensor_list must be a list of")
def all_to_all_list_wrong_length(w):
    return lambda: minipar.all_to_all([t4()] * w.size, [t4()])


@bad(ValueError, "output_tensor_list[0] is torch.Tensor[float64, (4,), cpu] but input_tensor")
def all_to_all_list_dtype_mix(w):
    outs = [torch.zeros(4, dtype=torch.float64) for _ in range(w.size)]
    return lambda: minipar.all_to_all(outs, [t4() for _ in range(w.size)])


@bad(ValueError, "input_split_sizes=[1] must be a list of")
def all_to_all_splits_wrong_length(w):
    out, inp = torch.zeros(2 * w.size), torch.zeros(2 * w.size)
    return lambda: minipar.all_to_all_single(out, inp, None, [1])


@bad(ValueError, "output_split_sizes=[-1, ")
def all_to_all_splits_negative(w):
    out, inp = torch.zeros(2 * w.size), torch.zeros(2 * w.size)
    splits = [-1] + [2] * (w.size - 2) + [3]
    return lambda: minipar.all_to_all_single(out, inp, splits, None)


@bad(ValueError, "input_list[0] has 4 elements but must have numel(output) = 3")
def reduce_scatter_list_wrong_shape(w):
    return lambda: minipar.reduce_scatter(torch.zeros(3), [t4() for _ in range(w.size)])


@bad(ValueError, "ReduceOp.BAND needs an integer or bool dtype, got float32")
def bitwise_on_float(w):
    return lambda: minipar.all_reduce(t4(), op=minipar.ReduceOp.BAND)


@bad(ValueError, "is not part of group world (its global ranks")
def get_group_rank_not_member(w):
    return lambda: minipar.get_group_rank(None, w.size)


@bad(ValueError, "group rank -1 is not part of group world")
def get_global_rank_out_of_range(w):
    return lambda: minipar.get_global_rank(minipar.group.WORLD, -1)


@bad(ValueError, "trying to initialize the default process group twice")
def init_process_group_twice(w):
    return lambda: minipar.init_process_group(minipar.get_backend())


@bad(ValueError, "backend must be one of mpi, gloo, nccl (or None), got 'ucc'")
def init_process_group_bad_backend(w):
    return lambda: minipar.init_process_group("ucc")


def cases(size):
    table = {f"program.{fn.__name__}": parity_case(fn) for fn in PROGRAMS}
    table["uneven_all_to_all"] = uneven_all_to_all_case
    table["bitwise_algorithms"] = bitwise_algorithms_case
    table["traced"] = traced_case
    table["p2p_timeout"] = p2p_timeout_case
    table.update({f"bad.{name}": bad_case(make) for name, make in BAD.items()})
    table.update({f"bad.{name}": unpicklable_case(make) for name, make in UNPICKLABLE.items()})
    return table
