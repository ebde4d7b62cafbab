"""Everything this process's minipar holds, in one object: `process`.

torch.distributed keeps its default group in one place (c10d's `_world`); minipar keeps all of
its per-process state here, so that a reader finds it in one docstring and `finalize()` empties
it in one place (runtime/world.py). Each field is filled by the layer that owns what it holds:

| field             | holds                                          | written by            |
| ----------------- | ---------------------------------------------- | --------------------- |
| world             | the default group (a Communicator), or None    | runtime/world.py      |
| debug             | cross-rank argument checks before each call    | init(debug=)          |
| fast_paths        | lean plans, direct steps, windows (fast/)      | init(fast_paths=)     |
| owns_torch        | init_process_group started torch.distributed   | runtime/process_group |
| launched_world    | minipar.launch started the world before fn     | launcher/notebook.py  |
| excepthook        | the abort-on-uncaught-exception hook is set    | runtime/world.py      |
| local_rank(_source), device | this rank's place on its node, its GPU | runtime/devices.py |
| nodes             | which node each world rank runs on (NodeMap)   | runtime/nodes.py      |
| progress          | the thread that runs async collectives         | collectives/work.py   |
| watchdog          | the thread that finds mismatched calls         | comm/guards/watchdog.py
|
| mismatch_after    | seconds a collective waits, then asks peers    | init(mismatch_after=) |
| stalls            | the waits that have lasted, by thread          | comm/guards/stall.py
|
| groups            | every group of the world, by group id (weak)   | comm/transport/base.py
  |
| ending            | the comparison of the calls at the job's end   | comm/guards/ending.py
|
| exit_check        | the world watched at exit (a rank leaving)     | comm/guards/leaving.py
|
| traces            | the open `with minipar.trace()` ledgers        | comm/trace/ledger.py        |
| run_trace         | the whole run's trace (`minipar run --trace`)  | runtime/run_trace.py  |
| memory_counters   | the open saved-activation counters             | parallel/activation_memory |
| memory_layers     | the names of the layers running forward now    | parallel/activation_memory |
| explaining        | the grader's open step-by-step recordings      | course/stepdiff.py    |
| links             | the cost model's links, {"mpi": .., "shm": ..} | cost/links.py         |
| abandoned         | requests given up on, kept with their buffers  | comm/transport/base.py
  |
| test_pool         | the test harness's warm rank jobs (pytest's)   | testing/harness.py    |

This module imports nothing: every layer may read it, and only the owner of a field writes it.
Caches (a plan per call shape, auto's answers, a node's windows) stay beside the code that
fills them and are named as caches; they hold nothing that outlives a world. Not here either,
on purpose: a group's shared-memory node (comm/transport/shm.py) and the windows that
`minipar.empty`'s buffers live in (comm/transport/shm_buffers.py) are kept on the group's
communicator, because they belong to that group (a buffer is read in place only by collectives on
it), every rank holds the same list in the same order, and they go when the group does.
"""

from __future__ import annotations


class ProcessState:
    """This process's minipar state (see the module's table). One instance: `process`."""

    def __init__(self):
        self.world = None
        self.debug = False
        self.fast_paths = True
        self.owns_torch = False
        self.launched_world = False
        self.excepthook = False
        self.local_rank = None
        self.local_rank_source = ""
        self.device = None
        self.nodes = None
        self.progress = None
        self.watchdog = None
        self.mismatch_after = 1.0
        self.stalls: dict = {}  # thread ident -> the stall.Stall it is waiting in
        self.groups: dict = {}  # group id -> weakref.ref to the Communicator
        self.ending = None
        self.exit_check = None
        self.traces: list = []
        self.run_trace = None
        self.memory_counters: list = []
        self.memory_layers: list = []
        self.explaining: list = []
        self.links: dict = {}
        self.abandoned: list = []
        self.test_pool = None

    def __repr__(self) -> str:
        world = "none" if self.world is None else f"{self.world.name} of {self.world.size}"
        return f"<minipar process state: world {world}, {len(self.traces)} open traces>"


process = ProcessState()
