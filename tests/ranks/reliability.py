"""Bad input and debug mode, run on every rank (see minipar.testing); the table in docs/errors.md
lists the same cases.

A bad-input case makes the same bad call on every rank that it concerns (all of them, or only the
root for a root's own list, or only the non-members of a group) and checks four things: the
error's type, a fragment of its message, that nothing moved (the trace ledger saw no message and
no call, and the group's sequence number did not advance), and that every rank that made the call
got the very same message.

Debug mode cases: each field of the fingerprint, changed on the last rank only, makes every rank
raise the same MismatchError naming both calls, and the group still works afterwards.
"""

import contextlib

import numpy as np
import torch

import minipar
from minipar.collectives.reduce_op import ReduceOp
from minipar.errors import MiniparError, MismatchError

BAD = {}  # name -> make(world) returning the bad call; attributes: error, fragment, who


def bad(error, fragment, who="all"):
    """Register a bad-input case. who: "all" ranks, "root" (rank 0 only), "others" (not 0)."""

    def register(make):
        make.error, make.fragment, make.who = error, fragment, who
        BAD[make.__name__] = make
        return make

    return register


def world():
    return minipar.init()


def x4():
    return np.zeros(4)


# -- roots and peers -------------------------------------------------------------------------
@bad(ValueError, "src=-1 is not a rank of group world")
def root_negative(w):
    x = x4()
    return lambda: minipar.broadcast(x, -1)


@bad(ValueError, "is not a rank of group world (world size")
def root_too_large(w):
    x = x4()
    return lambda: minipar.reduce(x, w.size)


@bad(ValueError, "dst=0.0 is not a rank of group world")
def root_not_int(w):
    x = x4()
    return lambda: minipar.gather(x, None, dst=0.0)


@bad(ValueError, "src=True is not a rank of group world")
def root_bool(w):
    x = x4()
    return lambda: minipar.scatter(x, None, src=True)


@bad(ValueError, "dst rank")
def peer_out_of_range(w):
    x = x4()
    return lambda: w.send(x, w.size)


@bad(ValueError, "must be an int in [0, 32768)")
def tag_out_of_range(w):
    x = x4()
    return lambda: w.send(x, w.rank, tag=1 << 15)


# -- output buffers: size, shape, dtype, kind, list lengths ----------------------------------
@bad(ValueError, "output_tensor has 5 elements but must have")
def output_wrong_size(w):
    out, inp = np.zeros(5 if w.size != 5 else 6), np.zeros(1)
    return lambda: minipar.all_gather_into_tensor(out, inp)


@bad(ValueError, "output has 3 elements but must have numel(input)")
def reduce_scatter_output_wrong_size(w):
    out, inp = np.zeros(3), np.zeros(3 * w.size + 1)
    return lambda: minipar.reduce_scatter_tensor(out, inp)


@bad(ValueError, "output has")
def all_to_all_output_wrong_size(w):
    out, inp = np.zeros(2 * w.size + 1), np.zeros(2 * w.size)
    return lambda: minipar.all_to_all_single(out, inp)


@bad(ValueError, "they must have the same type, dtype and device")
def output_wrong_dtype(w):
    out, inp = np.zeros(w.size * 4, dtype=np.float32), x4()
    return lambda: minipar.all_gather_into_tensor(out, inp)


@bad(ValueError, "tensor_list[0] has shape (2, 2) but tensor has shape (4,)")
def list_entry_wrong_shape(w):
    outs, inp = [np.zeros((2, 2)) for _ in range(w.size)], x4()
    return lambda: minipar.all_gather(outs, inp)


@bad(ValueError, "tensor_list[0] is numpy.ndarray[int64")
def list_entry_wrong_dtype(w):
    outs, inp = [np.zeros(4, dtype=np.int64) for _ in range(w.size)], x4()
    return lambda: minipar.all_gather(outs, inp)


@bad(ValueError, "tensor_list must be a list of")
def list_too_long(w):
    outs, inp = [x4() for _ in range(w.size + 1)], x4()
    return lambda: minipar.all_gather(outs, inp)


@bad(ValueError, "tensor_list must be a list of")
def list_not_a_list(w):
    out, inp = np.zeros(4 * w.size), x4()
    return lambda: minipar.all_gather(out, inp)


@bad(ValueError, "gather_list must be a list of", who="root")
def gather_list_wrong_length(w):
    x = x4()
    return lambda: minipar.gather(x, [x4()], dst=0) if w.size != 1 else minipar.gather(x, [], 0)


@bad(ValueError, "scatter_list must be a list of", who="root")
def scatter_list_missing_on_src(w):
    x = x4()
    return lambda: minipar.scatter(x, None, src=0)


@bad(ValueError, "must have the same type, dtype and device")
def numpy_torch_mix(w):
    out, inp = torch.zeros(4 * w.size, dtype=torch.float64), x4()
    return lambda: minipar.all_gather_into_tensor(out, inp)


@bad(ValueError, "must have the same type, dtype and device")
def torch_numpy_mix_all_to_all(w):
    out, inp = np.zeros(2 * w.size), torch.zeros(2 * w.size, dtype=torch.float64)
    return lambda: minipar.all_to_all_single(out, inp)


@bad(ValueError, "needs separate output and input buffers")
def all_to_all_in_place(w):
    x = np.zeros(2 * w.size)
    return lambda: minipar.all_to_all_single(x, x)


@bad(ValueError, "sums to")
def all_to_all_splits_wrong_sum(w):
    out, inp = np.zeros(2 * w.size), np.zeros(2 * w.size)
    return lambda: minipar.all_to_all_single(out, inp, [1] * w.size, [1] * w.size)


@bad(ValueError, "not divisible by the group size")
def all_to_all_not_divisible(w):
    out, inp = np.zeros(w.size + 1), np.zeros(w.size + 1)
    return lambda: minipar.all_to_all_single(out, inp) if w.size > 1 else _raise_like()


def _raise_like():  # on one rank every count divides: stand in for the same error
    raise ValueError("not divisible by the group size (world of one)")


# -- ops and dtypes ----------------------------------------------------------------------------
@bad(ValueError, "ReduceOp.AVG needs a floating-point dtype, got int32")
def avg_on_integers(w):
    x = np.ones(4, dtype=np.int32)
    return lambda: minipar.all_reduce(x, op=ReduceOp.AVG)


@bad(ValueError, "ReduceOp.AVG needs a floating-point dtype, got bool")
def avg_on_bool(w):
    return lambda: minipar.reduce_scatter_tensor(
        torch.ones(1, dtype=torch.bool), torch.ones(w.size, dtype=torch.bool), op="avg"
    )


@bad(ValueError, "ReduceOp.MAX needs an ordered dtype, got complex64")
def max_on_complex(w):
    x = np.ones(4, dtype=np.complex64)
    return lambda: minipar.all_reduce(x, op=ReduceOp.MAX)


@bad(ValueError, "unknown reduction op 'mean'; choose one of SUM, PRODUCT, MIN, MAX, AVG")
def unknown_op(w):
    x = x4()
    return lambda: minipar.all_reduce(x, op="mean")


@bad(ValueError, "unknown reduction op None")
def op_none(w):
    x = x4()
    return lambda: minipar.reduce(x, 0, op=None)


# -- buffers -----------------------------------------------------------------------------------
@bad(ValueError, "tensor is a non-contiguous numpy array")
def non_contiguous_numpy(w):
    x = np.zeros((4, 4))[:, 0]
    return lambda: minipar.all_reduce(x)


@bad(ValueError, "input_tensor is a non-contiguous torch tensor")
def non_contiguous_torch(w):
    inp = torch.zeros(3, 2).t()
    return lambda: minipar.all_gather_into_tensor(torch.zeros(6 * w.size), inp)


@bad(ValueError, "tensor is a read-only numpy array; it must be writable")
def read_only_destination(w):
    x = x4()
    x.setflags(write=False)
    return lambda: minipar.broadcast(x, 0)


@bad(ValueError, "tensor_list[0] is a read-only numpy array")
def read_only_list_entry(w):
    outs = [x4() for _ in range(w.size)]
    outs[0].setflags(write=False)
    return lambda: minipar.all_gather(outs, x4())


@bad(TypeError, "tensor must be a numpy.ndarray or torch.Tensor, got builtins.list")
def not_a_buffer(w):
    return lambda: minipar.all_reduce([1.0, 2.0])


@bad(TypeError, "tensor is a numpy array of dtype object")
def object_array(w):
    x = np.array([1, "a"], dtype=object)
    return lambda: minipar.broadcast(x, 0)


# -- algorithms, groups ------------------------------------------------------------------------
@bad(ValueError, "unknown all_reduce algorithm 'fastest'; choose one of auto, ")
def unknown_algorithm(w):
    x = x4()
    return lambda: minipar.all_reduce(x, algorithm="fastest")


@bad(ValueError, "unknown broadcast algorithm 'bruck'")
def algorithm_of_another_collective(w):
    x = x4()
    return lambda: minipar.broadcast(x, 0, algorithm="bruck")


@bad(ValueError, "unknown collective 'allreduce'")
def unknown_collective_name(w):
    return lambda: minipar.algorithms("allreduce")


@bad(ValueError, "is a built-in all_reduce algorithm")
def register_over_builtin(w):
    return lambda: minipar.register_algorithm("all_reduce", "ring", lambda call, x, op: None)


@bad(MiniparError, "is not a member of group [0]", who="others")
def group_without_caller(w):
    """Asking a group without the caller for a number raises (torch: -1); a collective on it
    does nothing, as torch's (tests/ranks/parity.py, outside_group)."""
    g = minipar.new_group([0])
    return lambda: minipar.get_rank(g)


@bad(TypeError, "group must be None (the default group) or a group from minipar.new_group")
def group_wrong_type(w):
    x = x4()
    return lambda: minipar.all_reduce(x, group="world")


@bad(ValueError, "is out of range for world size")
def new_group_rank_out_of_range(w):
    return lambda: minipar.new_group([0, w.size])


@bad(ValueError, "contain duplicates")
def new_group_duplicates(w):
    return lambda: minipar.new_group([0, 0])


@bad(ValueError, "timeout must be a positive number of seconds")
def init_bad_timeout(w):
    return lambda: minipar.init(timeout=0)


@bad(ValueError, "backend must be 'auto', 'mpi' or 'torch'")
def init_bad_backend(w):
    return lambda: minipar.init(backend="nccl")


def bad_case(make):
    def case():
        w = world()
        call = make(w)
        runs = make.who == "all" or (make.who == "root") == (w.rank == 0)
        message = None
        if runs:
            seq = w._seq
            with minipar.trace() as t:
                try:
                    call()
                except make.error as error:
                    message = f"{type(error).__name__}: {error}"
                else:
                    raise AssertionError(f"no {make.error.__name__} raised")
            assert make.fragment in message, message
            assert not t.messages and not t.calls, f"bytes moved before the error: {t}"
            assert w._seq == seq, "the failed call took a sequence number"
        everyone = [m for m in w.allgather_object(message) if m is not None]
        assert len(set(everyone)) <= 1, f"ranks disagree on the message: {everyone}"
        x = np.full(3, 1.0)  # the group still works
        minipar.all_reduce(x)
        assert (x == w.size).all(), x

    return case


# -- good input that looks suspicious ------------------------------------------------------------
def integers_wrap():
    """SUM and PRODUCT on integers wrap around (two's complement), the same in any order."""
    w = world()
    for algorithm in minipar.algorithms("all_reduce"):
        x = np.full(5, 100, dtype=np.int8)
        minipar.all_reduce(x, algorithm=algorithm)
        assert (x == wrapped(100 * w.size, np.int8)).all(), (algorithm, x)
        y = np.full(5, 3, dtype=np.uint8)
        minipar.all_reduce(y, op="product", algorithm=algorithm)
        assert (y == wrapped(3**w.size, np.uint8)).all(), (algorithm, y)


def wrapped(value: int, dtype):
    """value modulo 2^bits, as the integer dtype reads it (two's complement)."""
    return np.array([value], dtype=np.int64).astype(dtype)[0]


def read_only_input_is_fine():
    w = world()
    inp = np.full(2, float(w.rank))
    inp.setflags(write=False)
    out = np.zeros(2 * w.size)
    minipar.all_gather_into_tensor(out, inp)
    assert (out == np.repeat(np.arange(w.size), 2)).all(), out


def requires_grad_is_fine():
    """Like torch.distributed, collectives write into tensors that require grad."""
    w = world()
    x = torch.ones(6, requires_grad=True)
    minipar.all_reduce(x, algorithm="ring")
    assert torch.equal(x.detach(), torch.full((6,), float(w.size)))
    minipar.broadcast(x, 0)
    assert x.requires_grad


def empty_buffers_are_fine():
    w = world()
    for algorithm in minipar.algorithms("all_reduce"):
        x = np.zeros(0, dtype=np.float32)
        minipar.all_reduce(x, algorithm=algorithm)
    out = np.zeros(0)
    minipar.all_gather_into_tensor(out, np.zeros(0))
    assert w.size >= 1


# -- debug mode --------------------------------------------------------------------------------
@contextlib.contextmanager
def debug_mode():
    minipar.init(debug=True)
    try:
        yield
    finally:
        minipar.init(debug=False)


def deviations(w):
    """(what differs, the common call, the last rank's call) for each field of the fingerprint."""
    last = w.rank == w.size - 1
    x = np.full(6, 1.0)
    return {
        "collective": lambda: minipar.broadcast(x, 0) if last else minipar.all_reduce(x),
        "algorithm": lambda: minipar.all_reduce(x, algorithm="tree" if last else "ring"),
        "dtype": lambda: minipar.all_reduce(x.astype(np.int64) if last else x),
        "count": lambda: minipar.all_reduce(np.ones(7) if last else x),
        "shape": lambda: minipar.all_reduce(x.reshape(2, 3) if last else x),
        "root": lambda: minipar.broadcast(x, 1 if last else 0),
        "op": lambda: minipar.all_reduce(x, op="max" if last else "sum"),
    }


def debug_detects(field):
    def case():
        w = world()
        if w.size < 2:
            return
        with debug_mode(), minipar.trace() as t:
            seq = w._seq
            try:
                deviations(w)[field]()
            except MismatchError as error:
                message = str(error)
            else:
                raise AssertionError(f"debug mode missed a different {field}")
        assert not t.messages and w._seq == seq, "the mismatched call moved data"
        everyone = w.allgather_object(message)
        assert len(set(everyone)) == 1, everyone
        last = w.size - 1
        assert f"\n  rank {last}: call #{seq} " in message, message
        common = "rank 0" if w.size == 2 else "ranks " + ", ".join(map(str, range(last)))
        assert f"\n  {common}: call #{seq} " in message, message
        x = np.ones(3)  # the group is still usable, with debug mode on
        with debug_mode():
            minipar.all_reduce(x)
        assert (x == w.size).all()

    return case


def debug_detects_skipped_call():
    """A rank that skipped a call shows up as a different sequence number."""
    w = world()
    if w.size < 2:
        return
    g = minipar.new_group(list(range(w.size)), name="skipping")
    if g.rank == g.size - 1:
        g._seq += 1  # as if this rank had made a call on g the others never made
    try:
        with debug_mode():
            minipar.all_reduce(np.ones(2), group=g)
    except MismatchError as error:
        message = str(error)
    else:
        raise AssertionError("debug mode missed a skipped call")
    assert f"rank {w.size - 1}: call #1 all_reduce" in message, message
    assert "call #0 all_reduce" in message, message


def debug_passes_matching_calls():
    """No false alarms: every collective with matching arguments, numpy on some ranks and
    torch on others, async calls, barrier; and the trace is the same as without debug mode."""
    w = world()
    p, r = w.size, w.rank
    make = (lambda a: torch.from_numpy(a)) if r % 2 else (lambda a: a)

    def calls():
        x = make(np.full(4, float(r)))
        minipar.all_reduce(x)
        minipar.broadcast(x, p - 1)
        minipar.reduce(x, 0, op="max")
        minipar.all_gather_into_tensor(make(np.zeros(4 * p)), x)
        minipar.all_gather([make(np.zeros(4)) for _ in range(p)], x)
        minipar.reduce_scatter_tensor(make(np.zeros(2)), make(np.ones(2 * p)))
        minipar.scatter(x, [make(np.ones(4)) for _ in range(p)] if r == 0 else None, src=0)
        minipar.gather(x, [make(np.ones(4)) for _ in range(p)] if r == p - 1 else None, p - 1)
        minipar.all_to_all_single(make(np.zeros(2 * p)), make(np.ones(2 * p)))
        minipar.barrier()
        y = make(np.ones(5))
        minipar.all_reduce(y, async_op=True).wait()
        assert (np.asarray(y) == p).all()

    with minipar.trace() as plain:
        calls()
    with debug_mode(), minipar.trace() as checked:
        calls()
    assert [
        (m.collective, m.algorithm, m.step, m.kind, m.peer, m.nbytes) for m in plain.messages
    ] == [
        (m.collective, m.algorithm, m.step, m.kind, m.peer, m.nbytes) for m in checked.messages
    ], "debug mode changed what the trace shows"


def debug_in_sub_group():
    """A mismatch inside the even ranks' group raises there only; the odd ranks carry on."""
    w = world()
    if w.size < 3:
        return
    evens = list(range(0, w.size, 2))
    g = minipar.new_group(evens)
    odd = minipar.new_group(list(range(1, w.size, 2)))
    with debug_mode():
        if w.rank % 2:
            x = np.ones(2)
            minipar.all_reduce(x, group=odd)
            assert (x == odd.size).all()
            return
        x = np.ones(3 if w.rank == evens[-1] else 2)
        try:
            minipar.all_reduce(x, group=g)
        except MismatchError as error:
            assert f"group{evens}" in str(error) and "shape=(3,)" in str(error), error
        else:
            raise AssertionError("mismatch in the sub-group not detected")


def debug_env_and_init():
    """init(debug=...) switches it; a plain init() later keeps it as it was."""
    from minipar import runtime

    minipar.init(debug=True)
    minipar.init()
    assert runtime.debug_enabled()
    minipar.init(debug=False)
    minipar.init()
    assert not runtime.debug_enabled()


def cases(size):
    table = {f"bad.{name}": bad_case(make) for name, make in BAD.items()}
    table["good.integers_wrap"] = integers_wrap
    table["good.read_only_input"] = read_only_input_is_fine
    table["good.requires_grad"] = requires_grad_is_fine
    table["good.empty_buffers"] = empty_buffers_are_fine
    for field in deviations_fields():
        table[f"debug.detects_{field}"] = debug_detects(field)
    table["debug.detects_skipped_call"] = debug_detects_skipped_call
    table["debug.passes_matching_calls"] = debug_passes_matching_calls
    table["debug.in_sub_group"] = debug_in_sub_group
    table["debug.init_keeps_setting"] = debug_env_and_init
    return table


def deviations_fields():
    return ["collective", "algorithm", "dtype", "count", "shape", "root", "op"]
