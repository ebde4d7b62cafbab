"""The groups a warm rank's cases make, freed once nothing holds them (testing/server.py).

MPI gives a process about 2,048 communicators (MPICH: "Too many communicators") and mpi4py
frees none by itself; a gloo group keeps its sockets open. A job that serves a whole pytest
session must give them back. `GroupTracker` wraps the world communicator class's `split`
(through which `minipar.new_group` and every `group.split` go) and remembers each group
weakly, with what frees it: the MPI communicator or torch's process group, and (noted after
every case) the shared-memory window and node communicator its shm transport mapped, and the
windows its buffers from `minipar.empty` live in (comm/transport/shm_buffers.py: DDP's buckets,
FSDP's slots; minipar frees those only at the node's next allocation, which a dropped group never
makes).

A suite may keep a group from one case to the next (a module-level cache), so groups are freed
when the suite's batch ends: the server drops the suite and the helper modules it imported, the
garbage collector runs, and every group whose object is gone is freed. Freeing a window is
collective, so the ranks first agree over the harness's control group: a group is freed when
every member has let go of it, in the order the groups were made (the same on every member),
its windows only when every member still knows the same ones. A group still held (by a
helper's cache, or by a request abandoned after a timeout, which may still write into its
buffers) is kept.
"""

from __future__ import annotations

import gc
import weakref

from minipar import runtime
from minipar.comm.guards import watchdog
from minipar.comm.transport.base import NonMember


class Tracked:
    """One group a case made: what every member calls it, and the handles that free it."""

    def __init__(self, group, key):
        self.ref, self.key = weakref.ref(group), key
        self.members = list(group.global_ranks)
        self.mpi = getattr(group, "mpi", None)  # mpi4py's communicator (the MPI transport)
        self.torch_group = getattr(group, "group", None)  # torch's process group (gloo)
        self.window = self.node_comm = None
        self.buffers: list = []  # shm_buffers.Window objects on the group's node

    def note_window(self) -> None:
        node = getattr(self.ref(), "_shm_node", None)
        if node:
            self.window, self.node_comm = node.win, node.mpi
            self.buffers = list(node.buffers)

    def windows(self) -> tuple | None:
        """What this rank would free collectively (compared with the other members first):
        None for no window, else the buffer windows' serial numbers."""
        if self.window is None and not self.buffers:
            return None
        return tuple(buffer.serial for buffer in self.buffers)

    def free(self, window: bool) -> None:
        if window:
            for buffer in self.buffers:  # in allocation order, as on every member
                if buffer.win:  # (one minipar freed itself, at an allocation, is null)
                    buffer.free()
            if self.window:  # (a window minipar freed itself, growing it, is null)
                self.window.Unlock_all()
                self.window.Free()
        if self.node_comm is not None:
            self.node_comm.Free()
        if self.mpi is not None:
            self.mpi.Free()
        elif self.torch_group is not None:
            import torch.distributed as dist  # only a gloo group has one: torch is loaded then

            dist.destroy_process_group(self.torch_group)


class GroupTracker:
    def __init__(self, world_class):
        self.tracked: list[Tracked] = []
        self._made: dict = {}
        original = world_class.split

        def split(comm, ranks, name=None):
            group = original(comm, ranks, name)
            if not isinstance(group, NonMember):
                self._add(group)
            return group

        split.__doc__ = original.__doc__
        world_class.split = split

    def _add(self, group) -> None:
        ident = (group.name, tuple(group.global_ranks))
        self._made[ident] = self._made.get(ident, 0) + 1
        self.tracked.append(Tracked(group, (*ident, self._made[ident])))

    def alive(self) -> list:
        """The tracked groups some case still holds."""
        return [group for group in (e.ref() for e in self.tracked) if group is not None]

    def after_case(self) -> None:
        """Note the windows the live groups mapped (a group may die before the batch ends)."""
        for entry in self.tracked:
            entry.note_window()

    def free_unused(self, control) -> int:
        """Free every group no member holds any more (collective over `control`, all the job's
        ranks); returns how many this rank freed."""
        mpi = any(entry.mpi is not None for entry in self.tracked)
        with watchdog_paused(mpi, lambda: [control, *self.alive()]):
            self.after_case()
            gc.collect()
            gone = {e.key: (e.windows(),) for e in self.tracked if e.ref() is None}
            everyone = control.allgather_object(gone, "the harness freeing the cases' groups")
            freeing, kept = [], []
            for entry in self.tracked:
                views = [everyone[m].get(entry.key) for m in entry.members]
                if entry.ref() is None and None not in views:
                    same = all(view == views[0] for view in views) and views[0][0] is not None
                    freeing.append((entry, same))
                else:
                    kept.append(entry)
            self.tracked = kept
            for entry, window in freeing:
                entry.free(window)
        return len(freeing)


class watchdog_paused:  # noqa: N801  (a context manager)
    """No watchdog thread while groups are found unused and freed: between two looks it holds
    the groups it watched last, and MPI must not free a communicator another thread is using.
    Then a new one watches the default group and `alive()`, the groups still alive."""

    def __init__(self, needed: bool, alive):
        self.needed, self.alive = needed, alive

    def __enter__(self):
        if self.needed:
            watchdog.shutdown()

    def __exit__(self, *exc):
        if not self.needed:
            return
        if runtime.is_initialized():
            watchdog.watch(runtime.default_group())
        for group in self.alive():
            if getattr(group, "backend", None) == "mpi":
                watchdog.watch(group)
