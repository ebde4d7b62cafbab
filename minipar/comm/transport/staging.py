"""Pipelined staging: a large device buffer crosses a non-CUDA-aware MPI chunk by chunk, so the
device <-> host copies overlap the messages instead of adding to them.

Send of n bytes in k = ceil(n / chunk) chunks: one pinned host buffer of n bytes (from the pool);
all k device -> host copies are queued at once on a side copy stream (after the caller's stream,
so they copy finished data), each followed by an event; chunk i is handed to MPI (Isend) as soon
as its event has fired, while the copy engine already moves chunk i+1. Receive: k Irecvs into the
pinned buffer; as chunk i lands its host -> device copy is queued on the copy stream, while
chunks i+1.. are still on the wire. Bytes moved: n each way over PCIe, n over MPI, in k messages;
time ~ max(copy, wire) + one chunk's copy, instead of copy + wire + copy.

Both ends must cut a message the same way, so the chunk size is one number for the whole job
(MINIPAR_STAGE_CHUNK, bytes, the same on every rank; 0 turns pipelining off) and a message is
pipelined only when it is larger than one chunk. MPI keeps the order of messages with the same
source, tag and communicator, so the chunks of one message arrive in order; a receive from any
source takes its first chunk from whoever sends first and the rest from that rank.

For tests on machines without a GPU, MINIPAR_STAGE_HOST=1 sends CPU torch tensors through the
same chunked path (plain copies instead of streams and events): the chunking, ordering and size
checks then run under real MPI on a laptop. It is off by default and costs CPU tensors nothing.
"""

from __future__ import annotations

import os

from minipar.comm.transport import buffers

DEFAULT_CHUNK = 2 << 20  # 2 MiB: ~80 us over PCIe 4, long enough to hide an MPI message's start


def chunk_bytes() -> int:
    value = os.environ.get("MINIPAR_STAGE_CHUNK", "")
    if not value:
        return DEFAULT_CHUNK
    try:
        chunk = int(value)
    except ValueError:
        chunk = -1
    if chunk < 0:
        raise ValueError(f"MINIPAR_STAGE_CHUNK must be a number of bytes >= 0, got {value!r}")
    return chunk


def stage_host() -> bool:
    return os.environ.get("MINIPAR_STAGE_HOST") == "1"


def bounds(nbytes: int, chunk: int) -> list[tuple[int, int]]:
    """The [start, stop) byte ranges a message of nbytes is cut into (one range if not chunked)."""
    if chunk <= 0 or nbytes <= chunk:
        return [(0, nbytes)]
    return [(a, min(a + chunk, nbytes)) for a in range(0, nbytes, chunk)]


class Copier:
    """Device <-> host copies of byte ranges: on a side CUDA stream with one event per chunk, or,
    for a CPU tensor (MINIPAR_STAGE_HOST), plain copies that are finished when they return."""

    def __init__(self, buf):
        self.cuda = buffers.is_cuda(buf)
        self.stream = None
        if self.cuda:
            torch = buffers.torch_module()
            self.stream = _copy_stream(buf.device)
            self.stream.wait_stream(torch.cuda.current_stream(buf.device))

    def copy(self, dst, src):
        """Queue dst.copy_(src); return a token whose `ready()` says the bytes are there."""
        if not self.cuda:
            dst.copy_(src)
            return _Done
        torch = buffers.torch_module()
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return _Event(event)


class _DoneToken:
    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        pass


_Done = _DoneToken()


class _Event:
    def __init__(self, event):
        self.event = event

    def ready(self) -> bool:
        return self.event.query()

    def wait(self) -> None:
        self.event.synchronize()


_STREAMS: dict = {}  # one copy stream per device, reused (creating one costs ~10 us)


def _copy_stream(device):
    stream = _STREAMS.get(device)
    if stream is None:
        stream = _STREAMS[device] = buffers.torch_module().cuda.Stream(device)
    return stream
