"""The torch.distributed transport: point-to-point on an already-initialised process group.

With it everything minipar builds runs under torchrun or `torch.multiprocessing.spawn` +
`init_process_group`, not only under mpiexec. Buffers cross as raw bytes (uint8 views), so every
dtype works. gloo moves CPU tensors (CUDA ones are staged through the host); nccl moves CUDA
tensors (CPU ones are staged through the current device).

Differences from the MPI transport, all from gloo itself:
- gloo's point-to-point work cannot be polled, so waits block with the time left (same timeouts);
- a size mismatch is caught by gloo, which aborts the process with "Received data size doesn't
  match expected size" rather than raising;
- `split` calls `torch.distributed.new_group`, which every rank of the world must call.
"""

from __future__ import annotations

import atexit
import datetime
import os
import pickle
import socket
import sys
import time

from minipar.comm.trace import signature
from minipar.comm.transport import buffers
from minipar.comm.transport.base import Communicator, NonMember, Request, check_ranks, wait_all
from minipar.errors import CommTimeoutError, MessageSizeError, MismatchError

# seconds a timed-out rank waits to hear what its peer was doing; never more than the group's
# timeout: a peer stuck with us times out within about that, and a short timeout asks to fail fast
EXPLAIN_WAIT = 2.0


def torch_dist():
    import torch.distributed as dist

    return dist


class TorchRequest(Request):
    blocking = True

    def __init__(self, comm, kind, peer, tag, nbytes, work, staged=None, target=None):
        super().__init__(comm, kind, peer, tag, nbytes)
        self._work, self._staged, self._target = work, staged, target

    def _poll(self) -> bool:
        return False

    def _block(self, seconds: float) -> bool:
        try:
            self._work.wait(datetime.timedelta(seconds=seconds))
        except RuntimeError as error:
            if "Timed out" in str(error) or "timed out" in str(error):
                return False
            if (
                "clos" in str(error).lower()
            ):  # closed, closure: the peer's own wait timed out (or it left)
                closed = CommTimeoutError(
                    f"{self.describe()}: the connection to rank {self.peer} closed (its own wait "
                    f"timed out, or it left): {str(error).strip().splitlines()[-1]}"
                )
                closed.request = self
                raise closed from None
            raise
        return True

    def _finish(self) -> None:
        if self._target is not None:
            buffers.byte_view(self._target).copy_(self._staged)


class TorchAnySourceRequest(TorchRequest):
    """A receive from any other rank (gloo's recv_anysource): `peer` is the sender once done."""

    def _finish(self) -> None:
        super()._finish()
        self.peer = self._work._source_rank()

    def describe(self) -> str:
        return (
            f"recv of {self.nbytes} bytes from any rank (tag {self.tag}) on group "
            f"{self.comm.name}, as rank {self.comm.rank}"
        )


class SelfRequest(Request):
    """A message to or from this same rank (gloo cannot send to itself): a local mailbox."""

    def __init__(self, comm, kind, tag, buf):
        super().__init__(comm, kind, comm.rank, tag, buffers.nbytes(buf))
        self._buf = buf
        if kind == "send":
            comm._mailbox.setdefault(tag, []).append(buffers.as_bytes(buf).copy())

    def _poll(self) -> bool:
        if self.kind == "send":
            return True
        waiting = self.comm._mailbox.get(self.tag)
        if not waiting:
            return False
        data = waiting.pop(0)
        if data.size != self.nbytes:
            raise MessageSizeError(
                f"rank {self.comm.rank} expected {self.nbytes} bytes from itself (tag "
                f"{self.tag}) but {data.size} were sent"
            )
        buffers.as_bytes(self._buf)[:] = data
        return True


class TorchBarrierRequest(TorchRequest):
    blocking = False

    def _poll(self) -> bool:
        return self._work.is_completed()

    def describe(self) -> str:
        return f"the other ranks of group {self.comm.name} to reach the barrier"


class TorchControlRequest(TorchBarrierRequest):
    def describe(self) -> str:
        return f"the other ranks of group {self.comm.name} to join a control all-gather"


class TorchCommunicator(Communicator):
    """A torch.distributed process group (the default one when `group` is None)."""

    backend = "torch"

    def __init__(self, group=None, name: str = "world", timeout: float = 300.0, gid="w"):
        dist = torch_dist()
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised; call init_process_group")
        self.group = group if group is not None else dist.group.WORLD
        size = dist.get_world_size(self.group)
        glob = dist.get_process_group_ranks(self.group)
        super().__init__(dist.get_rank(self.group), size, name, timeout, glob, gid)
        self.pg_backend = dist.get_backend(self.group)
        self._mailbox: dict[int, list] = {}

    def _wire(self, buf, outgoing: bool):
        """(tensor torch.distributed moves, or a staged copy of it; staged or None)."""
        import torch

        raw = (
            buffers.byte_view(buf)
            if buffers.is_torch(buf)
            else torch.from_numpy(buffers.as_bytes(buf))
        )
        want_cuda = self.pg_backend == "nccl"
        if raw.is_cuda == want_cuda:
            return raw, None
        if raw.is_cuda:
            torch.cuda.current_stream(raw.device).synchronize()
        device = torch.device("cuda", torch.cuda.current_device()) if want_cuda else "cpu"
        staged = (
            raw.to(device)
            if outgoing
            else torch.empty(raw.numel(), dtype=torch.uint8, device=device)
        )
        return staged, staged

    def explain_timeout(self, call, error):
        """gloo cannot probe, and a gloo wait that timed out closes the connection, so nothing
        can be checked while a call runs. At its timeout a rank writes the call it is stuck in
        (number, signature, the calls before it, group) to torch.distributed's key-value store,
        under the group and under its own world rank, and reads the peer's (the peer, timed out
        too or cut off by the closed connection, does the same): MismatchError if their calls
        part, or if the peer is stuck on another group, else the timeout, saying what the peer
        was doing."""
        request = getattr(error, "request", None)
        store = _store()
        if store is None or request is None or request.peer == self.rank:
            return error
        entry = self._calls[call.seq % len(self._calls)]
        sig = signature.normal(entry[1], self.size)
        mine = (call.seq, sig, time.time(), self.gid, self.name, self.recent_calls(call.seq))
        store.set(self._store_key(self.rank), pickle.dumps(mine))
        store.set(_rank_key(self.global_ranks[self.rank]), pickle.dumps(mine))
        since = mine[2] - self.timeout - 5
        wait = min(EXPLAIN_WAIT, self.timeout)
        theirs = _read_recent(store, self._store_key(request.peer), since, wait)
        peer = request.peer
        if theirs is None:
            elsewhere = _read_recent(store, _rank_key(self.global_ranks[peer]), since, 0.0)
            if elsewhere is not None and elsewhere[3] != self.gid:
                me, them = self.global_ranks[self.rank], self.global_ranks[peer]
                text = signature.groups_text(
                    (me, self.name, call.seq, sig), (them, elsewhere[4], elsewhere[0], elsewhere[1])
                )
                return MismatchError(f"{text} (found at the timeout: gloo has no probe)")
            return CommTimeoutError(
                f"{error}; rank {peer} is not stuck in a minipar call on this group "
                f"(it did not say within {wait:g} s: busy elsewhere, or gone)"
            )
        found = signature.first_difference(mine[5], theirs[5])
        if found is not None:
            text = signature.difference_text(self.name, found, self.rank, peer)
            return MismatchError(f"{text} (found at the timeout: gloo has no probe)")
        return CommTimeoutError(
            f"{error}; rank {peer} is stuck in call #{theirs[0]}: {signature.render(theirs[1])}"
        )

    def _store_key(self, rank: int) -> str:
        return f"minipar/stuck/{self.gid}/{rank}"

    def _post_send(self, buf, dst, tag) -> Request:
        if dst == self.rank:
            return SelfRequest(self, "send", tag, buf)
        wire, staged = self._wire(buf, outgoing=True)
        work = torch_dist().isend(wire, self.global_ranks[dst], group=self.group, tag=tag)
        return TorchRequest(self, "send", dst, tag, buffers.nbytes(buf), work, staged)

    def _post_recv(self, buf, src, tag) -> Request:
        if src == self.rank:
            return SelfRequest(self, "recv", tag, buf)
        wire, staged = self._wire(buf, outgoing=False)
        work = torch_dist().irecv(wire, self.global_ranks[src], group=self.group, tag=tag)
        target = buf if staged is not None else None
        if target is not None and not buffers.is_torch(buf):
            import torch

            target = torch.from_numpy(buffers.as_bytes(buf))
        return TorchRequest(self, "recv", src, tag, buffers.nbytes(buf), work, staged, target)

    def _post_recv_any(self, buf, tag) -> Request:
        wire, staged = self._wire(buf, outgoing=False)
        work = torch_dist().irecv(wire, None, group=self.group, tag=tag)
        target = buf if staged is not None else None
        if target is not None and not buffers.is_torch(buf):
            import torch

            target = torch.from_numpy(buffers.as_bytes(buf))
        nbytes = buffers.nbytes(buf)
        return TorchAnySourceRequest(self, "recv", -1, tag, nbytes, work, staged, target)

    def _post_barrier(self) -> Request:
        work = torch_dist().barrier(group=self.group, async_op=True)
        return TorchBarrierRequest(self, "barrier", -1, -1, 0, work)

    def allgather_object(self, obj, context: str = "") -> list:
        """Pickled control messages: lengths, then the padded bytes, each an async all_gather
        polled within the timeout (torch's own all_gather_object would wait for the process
        group's timeout, 30 minutes by default)."""
        import torch

        device = torch.device("cpu")
        if self.pg_backend == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
        sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.size)]
        mine = torch.tensor([data.numel()], dtype=torch.int64, device=device)
        dist = torch_dist()
        self._control(dist.all_gather(sizes, mine, group=self.group, async_op=True), context)
        counts = [int(n) for n in sizes]
        padded = torch.zeros(max(counts), dtype=torch.uint8, device=device)
        padded[: data.numel()] = data
        outs = [torch.empty_like(padded) for _ in range(self.size)]
        self._control(dist.all_gather(outs, padded, group=self.group, async_op=True), context)
        return [pickle.loads(o[:n].cpu().numpy().tobytes()) for o, n in zip(outs, counts)]

    def _control(self, work, context: str) -> None:
        wait_all([TorchControlRequest(self, "barrier", -1, -1, 0, work)], self.timeout, context)

    def split(self, ranks, name: str | None = None):
        ranks = check_ranks(ranks, self.size)
        glob = [self.global_ranks[r] for r in ranks]
        gid = self.child_gid()  # counted on every rank, members or not
        group = torch_dist().new_group(glob)  # every rank of the world calls this, members or not
        if self.rank not in ranks:
            return NonMember(ranks, self.rank)
        return TorchCommunicator(group, name or f"group{glob}", self.timeout, gid)

    def abort(self, code: int = 1) -> None:
        sys.stderr.flush()
        os._exit(code)


def _rank_key(global_rank: int) -> str:
    """Where a rank's latest stuck call is written, whatever its group."""
    return f"minipar/stuck/rank/{global_rank}"


def _store():
    """torch.distributed's own key-value store (TCPStore under torchrun), or None."""
    try:
        return torch_dist().distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


def _read_recent(store, key: str, since: float, wait: float):
    """The (seq, signature, time, group id, group name, recent calls) a peer wrote under `key`
    after `since`, waiting up to `wait` seconds for it; None if it never came."""
    deadline = time.monotonic() + wait
    while True:
        if store.check([key]):
            entry = pickle.loads(store.get(key))
            if entry[2] >= since:
                return entry
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def init_from_env(backend: str | None = None, timeout: float = 300.0) -> None:
    """init_process_group from torchrun's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT."""
    import torch

    dist = torch_dist()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:  # NCCL needs a GPU per rank; ranks sharing one GPU use gloo
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        backend = "nccl" if dist.is_nccl_available() and gpus >= local_ranks > 0 else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % max(gpus, 1))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))


def init_from_mpi(mpi_comm, backend: str = "gloo", timeout: float = 300.0) -> None:
    """Start torch.distributed inside an MPI job, one torch rank per MPI rank, same numbering.

    Rank 0 opens the rendezvous store on a port the kernel picks and tells the others its
    number over MPI (opened and held, so no other process can take it in between); the others
    join it at MASTER_ADDR if set, 127.0.0.1 when every rank is on one host, else rank 0's host
    name. With backend="nccl" each rank must own a GPU (rank modulo the local GPU count).
    """
    import torch

    dist = torch_dist()
    wait = datetime.timedelta(seconds=timeout)
    hosts = mpi_comm.allgather(socket.gethostname())
    rank = mpi_comm.Get_rank()
    store = None
    if rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=wait)
    port = mpi_comm.bcast(store.port if store else None, root=0)
    addr = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if len(set(hosts)) == 1 else hosts[0])
    if rank != 0:
        store = dist.TCPStore(addr, port, is_master=False, timeout=wait)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    atexit.register(_destroy)  # before MPI finalizes (atexit runs last-registered first)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=mpi_comm.Get_size(), timeout=wait
    )


def _destroy() -> None:
    dist = torch_dist()
    if dist.is_initialized():
        dist.destroy_process_group()
