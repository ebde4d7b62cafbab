"""The groups a warm rank's cases make, freed when their suite's batch ends (testing/server.py).

MPI gives a process about 2,048 communicators (MPICH: "Too many communicators") and mpi4py
frees none by itself; a gloo group keeps its sockets open. A job that serves a whole pytest
session must give them back. `GroupTracker` wraps the world communicator class's `split`
(through which `minipar.new_group` and every `group.split` go) and keeps each group made.

A suite may keep a group from one case to the next (a module-level cache), so groups are freed
when the suite's batch ends, after the server has dropped the suite and the helper modules it
imported. Freeing the shared-memory window a group mapped (comm/shm.py) is collective, so the
ranks first agree over the harness's control group: every group is freed in the order it was
made (the same on every member), except one that a member still needs, because a request
abandoned after a timeout may still write into its buffers (comm/base.py `abandon`); that one
is kept, like the request, for the life of the job.
"""

from __future__ import annotations

import gc

from minipar.comm import base
from minipar.comm.base import NonMember


class GroupTracker:
    def __init__(self, world_class):
        self.groups: list = []
        original = world_class.split

        def split(comm, ranks, name=None):
            group = original(comm, ranks, name)
            if not isinstance(group, NonMember):
                self.groups.append(group)
            return group

        split.__doc__ = original.__doc__
        world_class.split = split

    def key(self, group):
        """What every member calls this group: name, global ranks, and which one of that name."""
        ident = (group.name, tuple(group.global_ranks))
        alike = [g for g in self.groups if (g.name, tuple(g.global_ranks)) == ident]
        return (*ident, next(i for i, g in enumerate(alike) if g is group))

    def free_all(self, control) -> int:
        """Free the groups made so far (collective over `control`, every rank of the job);
        returns how many this rank keeps."""
        busy = {id(r.comm) for r in base.ABANDONED}
        keep = [self.key(g) for g in self.groups if id(g) in busy]
        everyone = control.allgather_object(keep, "the harness freeing the cases' groups")
        kept_by = set().union(*map(set, everyone))
        freeing = [g for g in self.groups if self.key(g) not in kept_by]
        self.groups = [g for g in self.groups if self.key(g) in kept_by]
        with _watchdog_paused(any(g.backend == "mpi" for g in freeing), control, self.groups):
            for group in freeing:
                _free(group)
        del freeing
        gc.collect()  # a torch group closes its sockets when its last reference goes
        return len(self.groups)


def _free(group) -> None:
    """The group's window and node communicator (if its shm transport mapped one), then the
    group itself (minipar.destroy_process_group: MPI_Comm_free, or torch's group destroyed)."""
    import minipar

    node = getattr(group, "_shm_node", None)
    if node and node.win is not None:
        node.win.Unlock_all()
        node.win.Free()
    if node:
        node.mpi.Free()
    minipar.destroy_process_group(group)


class _watchdog_paused:  # noqa: N801  (used as a context manager)
    """No watchdog thread while communicators are freed (it probes every group it watches, and
    MPI must not free a communicator another thread is using); then a new one watches the
    groups still alive."""

    def __init__(self, needed: bool, control, alive):
        self.needed, self.alive = needed, [control, *alive]

    def __enter__(self):
        if self.needed:
            from minipar.comm import watchdog

            watchdog.shutdown()

    def __exit__(self, *exc):
        if not self.needed:
            return
        import minipar
        from minipar.comm import watchdog

        if minipar.is_initialized():
            watchdog.watch(minipar.init())
        for group in self.alive:
            if group.backend == "mpi":
                watchdog.watch(group)
