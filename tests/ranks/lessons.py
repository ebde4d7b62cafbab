"""The lessons and their break-it labs on warm ranks (run by tests/test_lessons.py): each case
calls a lesson module's main() with the arguments `minipar lesson NN --quick [--break LAB]`
passes it, on the lesson's own number of ranks, and fails if it returns non-zero. The test reads
what every rank printed from the case's output: rank 0's key lines, nothing from the others.

A lesson's Page finalizes minipar only when it started it, so a lesson runs on ranks that
already have minipar running as it does under the launcher. The labs that leave their group
broken on purpose (02's deadlock, 10's refused message) run under the launcher instead, as
`minipar lesson` runs them (OWN_JOB).
"""

import importlib
import os

from minipar.course.lessons import LESSONS

OWN_JOB = {("02", "send-first"), ("10", "no-counts")}  # they leave the group failed
# quick runs that go through `minipar lesson` itself (its command, its exit, its --json records)
LAUNCHER = {"01", "12"}


def run(entry, argv):
    def case():
        module = importlib.import_module(entry.module)
        # rank 0's tables, unwrapped, so lines can be matched (the harness restores the
        # environment after every case, testing/isolation.py)
        os.environ["COLUMNS"] = "120"
        # the lessons' timing claims are a benchmark (`minipar lesson NN --json`, the records
        # in lessons/records/), never a timed test: here they are shown, not judged, while
        # bytes, steps and values are judged as always
        os.environ["MINIPAR_TIMING"] = "shown"
        status = module.main(argv)
        assert status == 0, f"lesson {entry.number} {' '.join(argv)} returned {status}"

    return case


def cable_fenced():
    """Lesson 05's cable reading (sharding_across_nodes.cable_during) on ranks of one node, a
    counter file standing in for eth0's: rank 0's step puts 1000 bytes on it at once while the
    other ranks read late (0.3 s). The node's bytes are the step's 1000; each rank reading its
    own, the late ones took theirs after the bytes and saw fewer (issue 71)."""
    import shutil
    import tempfile
    import time

    import minipar
    from minipar.course.lessons.sharding_across_nodes import cable_during

    w = minipar.init()
    folder = w.allgather_object(tempfile.mkdtemp() if w.rank == 0 else None)[0]
    path = os.path.join(folder, "eth0")
    if w.rank == 0:
        with open(path, "w") as f:
            f.write("0")
    w.barrier()

    def counter():
        time.sleep(0.3 if w.rank else 0)
        with open(path) as f:
            return int(f.read())

    def step():
        if w.rank == 0:
            with open(path, "w") as f:
                f.write("1000")

    try:
        got = cable_during(w, [0] * w.size, step, counter)
        assert got == 1000, f"the node's cable carried {got} B during the step, not 1000"
    finally:
        w.barrier()
        if w.rank == 0:
            shutil.rmtree(folder)


def cma_probe():
    """Lesson 01's one-copy question (single_copy.cma_works) against another way in to rank
    0's memory: rank 1 reads the same 8 bytes out of /proc/PID/mem, which the kernel allows on
    the same rule (ptrace's attach check). Both must agree, and where the kernel allows it
    (here, as root) both must read the bytes rank 0 wrote."""
    import numpy as np

    import minipar
    from minipar.course.lessons import single_copy

    w = minipar.init()
    buf = np.array([0x1122334455667788], np.int64)
    where = w.allgather_object((os.getpid(), buf.ctypes.data))[0]
    seen = None
    if w.rank == 1:
        try:
            with open(f"/proc/{where[0]}/mem", "rb") as mem:
                mem.seek(where[1])
                seen = mem.read(8) == buf.tobytes()
        except OSError:
            seen = False
    seen = w.allgather_object(seen)[1]
    got = single_copy.cma_works(w)
    w.barrier()  # rank 0's buffer stays alive until rank 1 has read it
    assert got == seen, f"cma_works says {got}, /proc/PID/mem says {seen}"
    if os.geteuid() == 0:
        assert got, "root may read a process of its own: cma_works must say True"
    assert single_copy.copies(w) == (1.0 if got else 2.0)
    took = single_copy.read_seconds(w, 1 << 20, 3)  # lesson 01's one copy between the ranks
    assert (took is not None) == got, f"read_seconds {took} where cma_works says {got}"
    assert took is None or 0 < took < 1.0, took


def cases(size):
    table = {}
    if size == 2:
        table["cable_fenced"] = cable_fenced
        table["cma_probe"] = cma_probe
    for entry in LESSONS:
        if entry.ranks != size:
            continue
        if entry.number not in LAUNCHER:
            table[f"quick.{entry.number}"] = run(entry, ["--quick"])
        for lab in entry.breaks:
            if (entry.number, lab) not in OWN_JOB:
                table[f"lab.{entry.number}.{lab}"] = run(entry, ["--quick", "--break", lab])
    return table
