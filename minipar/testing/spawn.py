"""N gloo ranks on this host from one process, with no race for the rendezvous port.

    spawn(fn, args, nprocs)              # fn(rank, *args) runs in each of nprocs processes, gloo up
    spawn(fn, args, nprocs, fork=True)   # the same, the ranks forked from this process

The usual recipe picks a "free" port (bind to port 0, read it, close it) and hands the number
to the ranks, whose rank 0 then binds it again. Between the close and the bind any other
process may take it: on a busy test run another job's store did (EADDRINUSE). Here the parent
opens the rendezvous store itself on port 0 and holds it while the ranks run; the ranks join
as clients, so the port is never free for anyone else to take.

torch.multiprocessing.spawn starts each rank as a fresh interpreter, which imports torch again
(1.5-2.5 s of a core per rank). With fork=True the ranks are copies of this process, torch and
whatever else it imported already loaded: the test harness's warm jobs start that way (torch's
own distributed tests fork their ranks too). They are forked before the store exists, so no
thread of it is copied half-way; they read its port from a pipe.
"""

from __future__ import annotations

import datetime


def spawn(fn, args: tuple, nprocs: int, timeout: float = 300.0, fork: bool = False) -> None:
    """torch.multiprocessing.spawn of fn(rank, *args) on nprocs ranks of one gloo group."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    wait = datetime.timedelta(seconds=timeout)
    if not fork:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=wait)
        try:
            ranks = mp.start_processes(_rank, args=(nprocs, store.port, timeout, fn, args),
                                       nprocs=nprocs, join=False, start_method="spawn")  # fmt: skip
            _join(ranks)
        finally:
            del store  # closes the port once every rank has ended
        return
    ports = mp.get_context("fork").SimpleQueue()
    ranks = mp.start_processes(_forked_rank, args=(nprocs, ports, timeout, fn, args),
                               nprocs=nprocs, join=False, start_method="fork")  # fmt: skip
    try:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=wait)
        for _ in range(nprocs):
            ports.put(store.port)
        _join(ranks)
    finally:
        for process in ranks.processes:  # a failed rank's peers, or all of them if the store
            if process.is_alive():  # could not be opened
                process.terminate()


# what a rank raises when a peer died first: a consequence, never the cause
CONSEQUENCES = ("Connection reset by peer", "Connection closed by peer", "CommTimeoutError")


def _join(ranks) -> None:
    """Wait for every rank; when some failed, raise the first failure that is not a consequence
    of another's (torch names the first rank its wait saw end, and when two ended between two
    looks that is rank 0, the one whose peer vanished under it)."""
    import pickle

    from torch.multiprocessing import ProcessRaisedException

    try:
        while not ranks.join():  # raises, naming a rank, when one fails
            pass
    except ProcessRaisedException as error:
        failed = []  # every rank's traceback: torch has ended them all by now
        for index, path in enumerate(ranks.error_files):
            try:
                with open(path, "rb") as fh:
                    failed.append((index, pickle.load(fh)))
            except (OSError, EOFError, pickle.UnpicklingError):
                continue  # this rank raised nothing
        roots = [f for f in failed if not any(c in f[1] for c in CONSEQUENCES)]
        if not roots or roots[0][0] == error.error_index:
            raise
        index, trace = roots[0]
        msg = f"\n\n-- Process {index:d} terminated with the following error:\n{trace}"
        raise ProcessRaisedException(msg, index, ranks.processes[index].pid) from error


def _forked_rank(rank: int, size: int, ports, timeout: float, fn, args: tuple) -> None:
    _rank(rank, size, ports.get(), timeout, fn, args)


def _rank(rank: int, size: int, port: int, timeout: float, fn, args: tuple) -> None:
    import torch.distributed as dist

    wait = datetime.timedelta(seconds=timeout)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=wait)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=wait)
    fn(rank, *args)
    if dist.is_initialized():  # fn may have ended it itself
        dist.destroy_process_group()
