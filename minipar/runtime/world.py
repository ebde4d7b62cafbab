"""Starting and stopping minipar: which transport, the default group, timeouts, debug mode.

Like torch.distributed there is one default group (the world) that collectives use when
`group=None`; every other group is passed explicitly. `init()` is idempotent.

    minipar.init()               # "auto": MPI under mpiexec/srun, torch under torchrun or an
                                 # initialised torch.distributed, else a world of one (MPI)
    minipar.init(backend="mpi", timeout=10, debug=True)
    minipar.init(mismatch_after=0.5)  # a collective stuck this long asks its peers
    (comm/guards/stall.py)
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import warnings

from minipar.comm.guards import ending, leaving, watchdog
from minipar.comm.setup import mpisetup, netmod
from minipar.comm.transport import mpi
from minipar.comm.transport import torch as torch_comm
from minipar.comm.transport.base import NonMember, env_mismatch_after, env_timeout
from minipar.errors import MismatchError, NotInitializedError
from minipar.runtime import devices, nodes, run_trace
from minipar.state import process

MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR")
ABORT_GRACE = 0.2  # s an uncaught exception's rank waits before MPI_Abort (excepthook)
FAST_PATHS_ENV = "MINIPAR_FAST_PATHS"  # 0: every call takes the plain path (collectives/fast/)


def detect_backend() -> str:
    """'mpi' or 'torch', by the launcher that started this process."""
    if any(v in os.environ for v in MPI_ENV):
        return "mpi"
    torch = sys.modules.get("torch")
    if (
        torch is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    ):
        return "torch"
    if all(v in os.environ for v in TORCHRUN_ENV):
        return "torch"
    if "SLURM_PROCID" in os.environ:
        return "mpi"
    return "mpi"  # a world of one (MPI singleton init), or a larger one mpi4py still reports


def init(
    backend: str = "auto",
    timeout: float | None = None,
    debug: bool | None = None,
    fast_paths: bool | None = None,
    mismatch_after: float | None = None,
):
    """Start minipar (idempotent) and return the default group.

    backend: "auto", "mpi" or "torch" (adopt torch.distributed's default group, initialising it
    from torchrun's environment if needed). timeout: seconds any wait may take before it raises
    CommTimeoutError (default MINIPAR_TIMEOUT or 300). debug: cross-rank argument checks before
    every collective (default MINIPAR_DEBUG=1). fast_paths: False sends every call down the
    plain path a student reads (collectives/fast/ says what the fast ones do; the results are
    bitwise the same); default MINIPAR_FAST_PATHS, else on. mismatch_after: seconds a
    collective waits before it asks the peers it waits for which call they are in, so that
    ranks that disagree without a message to show it raise MismatchError (comm/guards/stall.py; MPI
    transport; default MINIPAR_MISMATCH_AFTER, else 1). Pass the same on every rank.
    """
    if backend not in ("auto", "mpi", "torch"):
        raise ValueError(f"backend must be 'auto', 'mpi' or 'torch', got {backend!r}")
    for what, seconds in (("timeout", timeout), ("mismatch_after", mismatch_after)):
        if seconds is not None and (not isinstance(seconds, (int, float)) or not seconds > 0):
            raise ValueError(f"{what} must be a positive number of seconds, got {seconds!r}")
    if mismatch_after is not None:
        process.mismatch_after = float(mismatch_after)
    if process.world is not None:  # already running: change only what the caller passed
        if timeout is not None:
            process.world.timeout = timeout
        if debug is not None:
            process.debug = bool(debug)
        if fast_paths is not None:
            process.fast_paths = bool(fast_paths)
        return process.world
    if mismatch_after is None:
        process.mismatch_after = env_mismatch_after()
    process.debug = bool(debug) if debug is not None else os.environ.get("MINIPAR_DEBUG") == "1"
    process.fast_paths = _fast_paths(fast_paths)
    seconds = timeout if timeout is not None else env_timeout()
    if backend == "auto":
        backend = detect_backend()
    if backend == "mpi":
        mpisetup.check_before_init()  # a launcher of another MPI: say so, before MPI_Init aborts
        netmod.choose()  # srun on 2+ nodes: the mpich wheel's OFI netmod, before MPI_Init
        comm = mpi.world(seconds)
        mpisetup.check_world(comm.size)  # n singletons where the launcher started n ranks
        # a rank leaving while others wait for it says so (comm/guards/leaving.py)
        leaving.arm(comm)
        mpi.say_up(comm.rank)  # `minipar run` names a rank that ends without exiting
        process.world = comm
    else:
        if not torch_comm.torch_dist().is_initialized():
            torch_comm.init_from_env(timeout=seconds)
        process.world = torch_comm.TorchCommunicator(None, "world", seconds)
    nodes.remember(process.world)  # which node each rank runs on (one small all-gather)
    devices.remember(process.world)  # the local rank; the GPU too if torch is imported already
    _install_excepthook()
    run_trace.start(process.world)  # `minipar run --trace DIR`: this rank's whole run traced
    return process.world


def _fast_paths(asked) -> bool:
    if asked is not None:
        return bool(asked)
    value = os.environ.get(FAST_PATHS_ENV, "1").strip().lower()
    if value not in ("0", "1", "", "on", "off", "true", "false"):
        raise ValueError(f"{FAST_PATHS_ENV} must be 0 or 1, got {value!r}")
    return value not in ("0", "off", "false")


def is_initialized() -> bool:
    return process.world is not None


def default_group():
    """The default group; raises NotInitializedError before init() or after finalize()."""
    if process.world is None:
        raise NotInitializedError()
    return process.world


def resolve(group):
    """The group a collective runs on: the default one for None; NonMember raises on use
    (the facade's calls ask `outside` first)."""
    if group is None:
        return default_group()
    default_group()  # a collective after finalize() fails here, even with an explicit group
    if isinstance(group, NonMember):
        group.rank  # noqa: B018  (raises the not-a-member error)
    if not isinstance(getattr(group, "size", None), int) or not hasattr(group, "_post_send"):
        raise TypeError(
            f"group must be None (the default group) or a group from minipar.new_group, "
            f"got {type(group).__module__}.{type(group).__qualname__}"
        )
    return group


def outside(group, call: str) -> bool:
    """True, with a warning, when `group` is one the calling rank is not in (what new_group
    gave a non-member): the caller then does nothing and returns None (recv: -1), as
    torch.distributed does, so that a program where every rank makes a call on a sub-group
    (its tutorial's all-reduce on new_group([0, 1]), run on 4 ranks) runs. The data-moving
    calls of the facade ask this first (after `group is not None`: the default group's calls
    skip even this function call); reading the group (.rank, get_rank) still raises."""
    if group.__class__ is not NonMember:
        return False
    default_group()  # after finalize(): NotInitializedError, as for any call
    warnings.warn(
        f"minipar.{call} on group {group.ranks}, which does not contain this rank: nothing "
        "done (torch.distributed's rule)",
        stacklevel=3,
    )
    return True


def debug_enabled() -> bool:
    return process.debug


def get_rank(group=None) -> int:
    return resolve(group).rank


def get_world_size(group=None) -> int:
    return resolve(group).size


def get_backend(group=None) -> str:
    """torch.distributed's answer: "mpi" on the MPI transport, else torch's backend ("gloo",
    "nccl") that minipar's torch transport runs over."""
    comm = resolve(group)
    return getattr(comm, "pg_backend", None) or comm.backend


def new_group(
    ranks=None,
    timeout=None,
    backend=None,
    pg_options=None,
    use_local_synchronization=False,
    group_desc=None,
    device_id=None,
    name: str | None = None,
):
    """A group of the given world ranks (None: all of them), in the order given; every rank
    calls it. Non-members get a NonMember. `timeout` (seconds or a timedelta) bounds the new
    group's waits; torch's backend, pg_options, use_local_synchronization and device_id are
    accepted and ignored (the group uses the world's transport); group_desc names it."""
    del backend, pg_options, use_local_synchronization, device_id
    parent = default_group()
    if ranks is None:
        ranks = list(range(parent.size))
    group = parent.split(ranks, name or group_desc)
    if timeout is not None and not isinstance(group, NonMember):
        group.timeout = getattr(timeout, "total_seconds", lambda: timeout)()
    return group


class _GroupNamespace:
    """torch's `dist.group.WORLD` (and `dist.GroupMember.WORLD`): the default group, or None
    before init, read when used."""

    @property
    def WORLD(self):  # noqa: N802  (torch's name)
        return process.world


group = GroupMember = _GroupNamespace()


def get_process_group_ranks(group) -> list[int]:
    """The global (world) ranks of the group's members, in group-rank order."""
    return list(resolve(group).global_ranks)


def get_group_rank(group, global_rank: int) -> int:
    """The rank in `group` of the process with world rank `global_rank`."""
    comm = resolve(group)
    if global_rank not in comm.global_ranks or isinstance(global_rank, bool):
        raise ValueError(
            f"global rank {global_rank!r} is not part of group {comm.name} (its global ranks: "
            f"{comm.global_ranks})"
        )
    return comm.global_ranks.index(global_rank)


def get_global_rank(group, group_rank: int) -> int:
    """The world rank of the process with rank `group_rank` in `group`."""
    comm = resolve(group)
    ok = isinstance(group_rank, int) and not isinstance(group_rank, bool)
    if not ok or not 0 <= group_rank < comm.size:
        raise ValueError(
            f"group rank {group_rank!r} is not part of group {comm.name} (group size "
            f"{comm.size}; valid: 0..{comm.size - 1})"
        )
    return comm.global_ranks[group_rank]


def finalize() -> None:
    """Stop minipar: wait for async work, compare the calls, stop the threads, forget the world.

    The one place this process's minipar state (minipar/state.py) is emptied, in this order:
    the progress thread finishes the async collectives queued on it; the ranks compare what each
    of their groups saw (comm/guards/ending.py: a collective, every rank calls finalize()); the
    watchdog stops looking (its probes must not run beside MPI's teardown), then the world, its
    groups and the device are forgotten. Open traces, the cost links and abandoned requests
    outlive a world on purpose. A mismatch the comparison found (one no wait raised: every rank
    returned from the bad call) is raised last, as MismatchError, on every rank of its group."""
    if process.world is None:
        return
    if process.progress is not None:
        process.progress.close()
        process.progress = None
    run_trace.finish()  # this rank's part of a `minipar run --trace`, once its work is done
    texts = ending.check(process.world, "finalize()")
    if texts:
        ending.report(process.world, texts, "finalize()", ends=False)
    watchdog.shutdown()
    devices.forget()
    nodes.forget()
    process.world = None
    process.launched_world = False
    process.groups.clear()
    if texts:
        raise MismatchError("\n".join(texts))


def _install_excepthook() -> None:
    """An uncaught exception on any rank ends the whole job: print it with the rank, then abort."""
    if process.excepthook:
        return
    process.excepthook = True
    previous = sys.excepthook

    def hook(kind, value, tb):
        comm = process.world
        if comm is None or comm.size == 1:
            return previous(kind, value, tb)
        rank = comm.global_ranks[comm.rank]
        text = "".join(traceback.format_exception(kind, value, tb))
        prefixed = "".join(f"[rank {rank}] {line}\n" for line in text.rstrip().splitlines())
        sys.stderr.write(prefixed)
        sys.stderr.write(f"[rank {rank}] minipar: aborting the job after an uncaught exception\n")
        sys.stderr.flush()
        time.sleep(ABORT_GRACE)  # ranks failing alike say so too: `minipar run` says it once
        comm.abort(1)

    sys.excepthook = hook


def exit_inside_collective(call, leaving: SystemExit) -> None:
    """sys.exit() inside a collective dooms it on every other rank: say where it happened, then
    end the whole job at once (the others would otherwise wait out their timeout)."""
    comm = call.comm
    if comm.size == 1:
        return
    rank = comm.global_ranks[comm.rank]
    code = leaving.code if isinstance(leaving.code, int) and leaving.code else 1
    sys.stderr.write(
        f"[rank {rank}] minipar: sys.exit({leaving.code!r}) inside {call.collective} (algorithm "
        f"{call.algorithm}) on group {comm.name}, step {call.step}; the other ranks cannot "
        "finish it, aborting the job\n"
    )
    sys.stderr.flush()
    (process.world or comm).abort(code)
