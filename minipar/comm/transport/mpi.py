"""The MPI transport: mpi4py's buffer calls (uppercase Isend/Irecv), never pickle on the data path.

Every buffer crosses as raw bytes (`MPI.BYTE`), so every dtype works, bfloat16 and float16
included, and the receiver checks that exactly as many bytes arrived as its buffer holds.
CUDA tensors go straight to MPI when it is CUDA-aware, else through pinned host buffers
(see comm/transport/cuda.py), chunk by chunk with the copies overlapped for messages larger than one
chunk (see comm/transport/staging.py and comm/transport/mpi_staged.py).
"""

from __future__ import annotations

import atexit
import itertools
import os
import pickle
import sys
import time

import numpy as np

from minipar.comm.guards import stall, watchdog
from minipar.comm.trace import ledger
from minipar.comm.transport import buffers, cuda, staging
from minipar.comm.transport.base import Communicator, NonMember, Request, check_ranks, wait_all
from minipar.comm.transport.mpi_requests import (
    MPIAnySourceRequest,
    MPIBarrierRequest,
    MPIControlRequest,
    MPIRequest,
    module,
)
from minipar.comm.transport.mpi_staged import PipelinedRecv, PipelinedSend
from minipar.errors import MiniparError

ABORT_GRACE = 0.5  # seconds between a rank's last words and MPI_Abort


class MPICommunicator(Communicator):
    """A group of MPI ranks (an mpi4py communicator)."""

    backend = "mpi"

    def __init__(self, mpi_comm, name: str, timeout: float, global_ranks=None, gid="w"):
        if global_ranks is None:
            global_ranks = range(mpi_comm.Get_size())
        self.tag_ub = world_tag_ub()  # 2^29 - 1 in MPICH, 2^31 - 1 in Open MPI
        size = mpi_comm.Get_size()
        super().__init__(mpi_comm.Get_rank(), size, name, timeout, global_ranks, gid)
        self.mpi = mpi_comm
        self._pool = None
        self._asked: set = set()  # (peer, seq) the watchdog already sent a notice about
        self._notices: list = []  # notices, questions and answers in flight, kept alive
        self._questions = itertools.count()  # numbers this rank's questions (comm/guards/stall.py)
        self._late: list = []  # (peer, reply tag, when asked): answers a finished wait left
        watchdog.watch(self)  # finds ranks that disagree about a call (comm/guards/watchdog.py)
        self._chunk = staging.chunk_bytes()  # the same on every rank: both ends cut alike
        self._stage_host = staging.stage_host()  # tests: CPU tensors take the chunked path
        self._lean: dict = {}  # collectives/lean.py's plans for this group
        self._control_spent = None  # why Ibarrier / Iallgather can no longer be trusted here

    def _pinned(self) -> cuda.PinnedPool:
        if self._pool is None:
            self._pool = cuda.PinnedPool()
        return self._pool

    def _pipelined(self, buf) -> bool:
        """Whether a torch tensor on a GPU (or any, under MINIPAR_STAGE_HOST) crosses in chunks
        with overlapped copies (comm/transport/staging.py). Callers test the cheap part first, so
        numpy arrays and CPU tensors pay one isinstance and one attribute read."""
        if buf.is_cuda and cuda.mpi_cuda_aware()[0]:
            return False
        return len(staging.bounds(buffers.nbytes(buf), self._chunk)) > 1

    def _wire(self, buf, outgoing: bool):
        """(what MPI reads or writes, staged host copy or None)."""
        if isinstance(buf, np.ndarray):
            return buf, None  # MPI reads its bytes as they are (`[buf, MPI.BYTE]`), any shape
        if not buffers.is_cuda(buf):
            return buffers.as_bytes(buf), None
        cuda.synchronize(buf)
        raw = buffers.byte_view(buf)
        aware = cuda.mpi_cuda_aware()[0]
        ledger.note_path(self, "send" if outgoing else "recv", -1, raw.numel(),
                         "direct" if aware else "staged")  # fmt: skip
        if aware:
            return raw, None
        staged = self._pinned().take(raw.numel())
        if outgoing:
            staged.copy_(raw)
        return staged.numpy(), staged

    def _post_send(self, buf, dst, tag) -> Request:
        if (
            not isinstance(buf, np.ndarray)
            and (buf.is_cuda or self._stage_host)
            and self._pipelined(buf)
        ):
            return PipelinedSend(self, buf, dst, tag)
        wire, staged = self._wire(buf, outgoing=True)
        req = self.mpi.Isend([wire, module().BYTE], dst, tag)
        return MPIRequest(self, "send", dst, tag, buffers.nbytes(buf), req, wire, staged)

    def _post_recv(self, buf, src, tag) -> Request:
        if (
            not isinstance(buf, np.ndarray)
            and (buf.is_cuda or self._stage_host)
            and self._pipelined(buf)
        ):
            return PipelinedRecv(self, buf, src, tag)
        wire, staged = self._wire(buf, outgoing=False)
        req = self.mpi.Irecv([wire, module().BYTE], src, tag)
        target = buf if staged is not None else None
        return MPIRequest(self, "recv", src, tag, buffers.nbytes(buf), req, wire, staged, target)

    def _post_recv_any(self, buf, tag) -> Request:
        if (
            not isinstance(buf, np.ndarray)
            and (buf.is_cuda or self._stage_host)
            and self._pipelined(buf)
        ):
            return PipelinedRecv(self, buf, None, tag)
        wire, staged = self._wire(buf, outgoing=False)
        req = self.mpi.Irecv([wire, module().BYTE], module().ANY_SOURCE, tag)
        target = buf if staged is not None else None
        nbytes = buffers.nbytes(buf)
        return MPIAnySourceRequest(self, "recv", -1, tag, nbytes, req, wire, staged, target)

    def _stall(self, pending):
        """A wait here has lasted: register it, and ask the peers once it lasts longer."""
        return stall.Stall(self, pending)

    def _peer_state(self, request, stalled) -> str:
        return stall.peer_state(self, request, stalled)

    def _control_usable(self) -> None:
        if self._control_spent is not None:
            raise MiniparError(
                f"group {self.name} cannot run another control collective: an earlier "
                f"{self._control_spent} and is still pending inside MPI, so it would meet this "
                "call's messages; make a new group (minipar.new_group) to go on"
            )

    def _post_barrier(self) -> Request:
        self._control_usable()
        return MPIBarrierRequest(self, "barrier", -1, -1, 0, self.mpi.Ibarrier(), None)

    def allgather_object(self, obj, context: str = "") -> list:
        """Pickled control messages (small): lengths, then the bytes, both with timeouts.
        `context` opens the timeout's message (what the all-gather was for)."""
        MPI = module()
        self._control_usable()
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        sizes = np.zeros(self.size, dtype=np.int64)
        req = self.mpi.Iallgather([np.array([data.size], dtype=np.int64), MPI.INT64_T], sizes)
        wait_all([MPIControlRequest(self, "barrier", -1, -1, 0, req, sizes)], self.timeout, context)
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        req = self.mpi.Iallgatherv([data, MPI.BYTE], [out, (sizes, None), MPI.BYTE])
        wait_all([MPIControlRequest(self, "barrier", -1, -1, 0, req, out)], self.timeout, context)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        return [pickle.loads(out[a:b].tobytes()) for a, b in zip(bounds[:-1], bounds[1:])]

    def split(self, ranks, name: str | None = None):
        ranks = check_ranks(ranks, self.size)
        gid = self.child_gid()  # counted on every rank of the parent, members or not
        MPI = module()
        member = self.rank in ranks
        color = 0 if member else MPI.UNDEFINED
        key = ranks.index(self.rank) if member else 0
        sub = self.mpi.Split(color, key)
        if not member:
            return NonMember(ranks, self.rank)
        glob = [self.global_ranks[r] for r in ranks]
        return MPICommunicator(sub, name or f"group{glob}", self.timeout, glob, gid)

    def abort(self, code: int = 1) -> None:
        """MPI_Abort kills every rank at once, and mpiexec may drop output it has not forwarded
        yet: flush, give the forwarder a moment to deliver this rank's last words, then abort.
        Never returns: MPICH's MPI_Abort returns once it has told mpiexec, which kills the
        ranks a moment later; this rank must not run on (and report a result) meanwhile."""
        sys.stdout.flush()
        sys.stderr.flush()
        say_aborted(self.global_ranks[self.rank])
        time.sleep(ABORT_GRACE)
        self.mpi.Abort(code)
        os._exit(code)


def say_aborted(rank: int) -> None:
    """Tell `minipar run` (its relay's folder, MINIPAR_RELAY_FOLDER) that this rank aborts, so
    the job ends even where the MPI's launcher cannot: Open MPI's waits for a node whose cable
    is gone before it ends the job (launcher/relay.py gives it a grace, then stops it)."""
    _say(f"aborted.{rank}")


def say_up(rank: int) -> None:
    """Tell `minipar run` this rank is up (up.R; it then watches the rank's output close), and
    take the word back at exit, its exit hooks run: a rank whose up.R outlives it was killed or
    crashed (launcher/relay.py's lost_first). Nothing is made at exit (a file made while the
    launcher removes the folder could keep it)."""
    made = _say(f"up.{rank}")
    if made:
        atexit.register(_unsay, made)


def _say(name: str) -> str | None:
    """Make the empty file `name` in the relay's folder; its path, or None (no relay)."""
    folder = os.environ.get("MINIPAR_RELAY_FOLDER")
    if folder:
        path = os.path.join(folder, name)
        try:
            open(path, "w").close()
            return path
        except OSError:
            pass
    return None


def _unsay(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def world_tag_ub() -> int:
    """MPI_TAG_UB: an attribute of COMM_WORLD only (the standard attaches it there; Open MPI's
    derived communicators return None), else the standard's guaranteed minimum, 32767."""
    MPI = module()
    value = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    return int(value) if value is not None else 32767


def world(timeout: float) -> MPICommunicator:
    """COMM_WORLD, with MPI initialised at the thread level async collectives need."""
    import mpi4py

    mpi4py.rc.thread_level = "multiple"
    MPI = module()
    if not MPI.Is_initialized():  # mpi4py was imported with rc.initialize off (a probe)
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_MULTIPLE:
        raise RuntimeError(
            f"MPI provides thread level {provided}, but minipar needs MPI_THREAD_MULTIPLE "
            f"({MPI.THREAD_MULTIPLE}) so a progress thread can run collectives; "
            f"this MPI is: {MPI.Get_library_version().splitlines()[0]}"
        )
    return MPICommunicator(MPI.COMM_WORLD, "world", timeout)
