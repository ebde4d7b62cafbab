"""N gloo ranks on this host from one process, with no race for the rendezvous port.

    spawn(fn, args, nprocs)   # fn(rank, *args) runs in each of nprocs processes, gloo up

The usual recipe picks a "free" port (bind to port 0, read it, close it) and hands the number
to the ranks, whose rank 0 then binds it again. Between the close and the bind any other
process may take it: on a busy test run another job's store did (EADDRINUSE). Here the parent
opens the rendezvous store itself on port 0 and holds it while the ranks run; the ranks join
as clients, so the port is never free for anyone else to take.
"""

from __future__ import annotations

import datetime


def spawn(fn, args: tuple, nprocs: int, timeout: float = 300.0) -> None:
    """torch.multiprocessing.spawn of fn(rank, *args) on nprocs ranks of one gloo group."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    wait = datetime.timedelta(seconds=timeout)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=wait)
    try:
        mp.spawn(_rank, args=(nprocs, store.port, timeout, fn, args), nprocs=nprocs)
    finally:
        del store  # closes the port once every rank has ended


def _rank(rank: int, size: int, port: int, timeout: float, fn, args: tuple) -> None:
    import torch.distributed as dist

    wait = datetime.timedelta(seconds=timeout)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=wait)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=wait)
    fn(rank, *args)
    if dist.is_initialized():  # fn may have ended it itself
        dist.destroy_process_group()
