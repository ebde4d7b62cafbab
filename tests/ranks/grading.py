"""The grader's explanations, on planted mistakes (run on every rank by minipar.testing).

tests/test_grading.py writes copies of solutions/ with one typical mistake each into
MINIPAR_PLANTED/<mistake>/, then launches this suite once. Each case runs one planted copy beside
the worked solution (minipar.course.stepdiff), catches the grader's ExplainedError and checks
that it names the right phase, step, rank and chunk.
"""

import contextlib
import functools
import os

import numpy as np

import minipar
from minipar import exercises
from minipar.collectives.call import Call
from minipar.course import stepdiff, whose
from minipar.runtime import nodes
from minipar.state import process


def world():
    return minipar.init()


@functools.cache
def control():
    w = world()
    group = w.split(list(range(w.size)), name="grading")
    group.timeout = 3 * w.timeout + 5
    return group


def planted(mistake: str, module: str, function: str):
    folder = os.path.join(os.environ["MINIPAR_PLANTED"], mistake)
    reference = exercises.load(module, "solutions")
    return stepdiff.graded(
        getattr(exercises.load(module, folder), function),
        getattr(reference, function),
        getattr(reference, "PHASES", ()),
        getattr(reference, "chunks_of_x", None),
    )


def all_reduce(mistake: str, module: str, function: str, two_nodes: bool = False):
    """`two_nodes`: the world's node map says ranks 0, 1 are node 0 and 2, 3 node 1 (data)."""

    def run():
        w = world()
        p = w.size

        def words(value, index=None):
            return whose.sum_words(value, p, index)

        stepdiff.describe_values(words)
        x = whose.sum_input(w.rank, p, 4 * p)
        with node_map([r // 2 for r in range(p)] if two_nodes else None):
            minipar.all_reduce(x, algorithm=planted(mistake, module, function))
        want = sum(whose.sum_input(r, p, 4 * p) for r in range(p))
        wrong = whose.first_wrong(x, want, words, w.rank)
        assert wrong is None, wrong

    return run


@contextlib.contextmanager
def node_map(owner):
    """Inside the block, rank r runs on node owner[r] (None: the map as it is)."""
    saved = process.nodes
    if owner is not None:
        process.nodes = nodes.from_keys([(n, f"node{n}") for n in owner], "the grading test")
    try:
        yield
    finally:
        process.nodes = saved


def ring_shift_send_first():
    def run():
        w = world()
        fn = planted("send_first_deadlock", "ex02_ring_shift", "ring_shift")
        x, out = np.zeros(1 << 20), np.zeros(1 << 20)  # 8 MiB: past MPI's eager limit
        fn(Call(w, "ring_shift", "student"), x, out, 1)

    return run


def broadcast_wrong_peer():
    def run():
        w = world()
        fn = planted("wrong_peer", "ex02_broadcast_binomial", "broadcast_binomial")
        x = whose.copy_input(w.rank, 37)
        minipar.broadcast(x, src=0, algorithm=fn)
        assert np.array_equal(x, whose.copy_input(0, 37)), "wrong data"

    return run


def later_rank_fails_first():
    """Rank 2 fails at once; rank 0 was waiting for a message from it (stopped, or timed out:
    either a consequence). The lower rank failed too, but the root cause named is rank 2."""

    def run():
        w = world()
        if w.rank == 2:
            raise AssertionError("rank 2's own mistake")
        if w.rank == 0:
            minipar.recv(np.zeros(4), src=2)

    return run


def expect(run, wanted: list[str], unwanted: tuple = ()):
    """A case: `run` explained by the grader, whose text must contain every string in `wanted`
    (on some failing rank: they all carry the same explanation) and none in `unwanted`."""

    def case():
        text = ""
        try:
            stepdiff.explained(run, control)()
        except stepdiff.ExplainedError as error:
            text = str(error)
        except Exception as error:  # noqa: BLE001 - reported below as unexplained
            text = f"UNEXPLAINED {type(error).__name__}: {error}"
        texts = [t for t in control().allgather_object(text) if t]
        assert texts, "the planted mistake passed on every rank"
        missing = [s for s in wanted if not any(s in t for t in texts)]
        assert not missing, f"not in the explanation: {missing}\n{texts[0]}"
        said = [s for s in unwanted if any(s in t for t in texts)]
        assert not said, f"in the explanation, wrongly: {said}\n{texts[0]}"

    return case


def cases(size):
    if size != 4:
        return {}  # the expected texts below are for 4 ranks
    two_level = ("ex04_hierarchical_allreduce", "all_reduce_two_level")
    ring, rd = (
        ("ex03_ring_allreduce", "all_reduce_ring"),
        (
            "ex03_recursive_doubling",
            "all_reduce_recursive_doubling",
        ),
    )
    return {
        "wrong_chunk": expect(
            all_reduce("wrong_chunk", *ring),
            [
                "all-gather step 2: rank 0 sent chunk 3 (x[12:16], 32 B) to rank 1; the reference "
                "sends chunk 2 (x[8:12], 32 B) to rank 1",
                "AssertionError: rank 0, element 4: holds element 8's sum of ranks {0, 1, 2, 3} "
                "but should hold the sum of ranks {0, 1, 2, 3}",
            ],
        ),
        "off_by_one_steps": expect(
            all_reduce("off_by_one_steps", *ring),
            [
                "reduce-scatter step 2: rank 0 sent chunk 0 (x[0:4], 32 B) to rank 1; the "
                "reference sends chunk 1 (x[4:8], 32 B) to rank 1",
                "yours reduce-scatter 2, all-gather 3; the reference reduce-scatter 3, "
                "all-gather 3",
            ],
        ),
        "wrong_size": expect(  # a size mismatch is named with its sizes, not shown as a hang
            all_reduce("wrong_size", *ring),
            [
                "all-gather step 0: rank 0 sent x[0:3] (in chunk 0, 24 B) to rank 1; the reference "
                "sends chunk 0 (x[0:4], 32 B) to rank 1: yours 3 elements, the reference 4 (a "
                "message of the wrong size",
                "(stopped: the sizes differ)",
            ],
            ("never completed", "still waiting", "steps per call.rounds()"),
        ),
        "send_first_deadlock": expect(
            ring_shift_send_first(),
            [
                "step 0: the reference receives all of out (8 MiB) from rank 3; rank 0 does not",
                "rank 0, step 0: was still waiting to finish: sent all of x (8 MiB) to rank 1",
                "rank 1, step 0: was still waiting to finish: sent all of x (8 MiB) to rank 2",
                "CommTimeoutError",
            ],
        ),
        "wrong_peer": expect(
            broadcast_wrong_peer(),
            [
                "step 0: rank 0 sent all of x (296 B) to rank 2; the reference sends all of x "
                "(296 B) to rank 1",
            ],
        ),
        "wrong_chunk_across": expect(
            all_reduce("wrong_chunk_across", *two_level, two_nodes=True),
            [
                "reduce-scatter across nodes step 0: rank 1 sent x[4:8] (in chunk 0, 32 B) to "
                "rank 3; the reference sends x[12:16] (in chunk 1, 32 B) to rank 3 (between "
                "nodes: node 0 and node 1)",
                "AssertionError: rank 0, element 8: holds the sum of ranks {0, 1} but should hold "
                "the sum of ranks {0, 1, 2, 3}",
            ],
        ),
        "root_cause_not_the_lowest_rank": expect(
            later_rank_fails_first(),
            [
                "AssertionError: rank 2's own mistake\n",
                "rank 2 failed first; what followed on the other ranks",
                "  rank 0: MismatchError: stopped waiting: rank 2 had already failed "
                "(AssertionError: rank 2's own mistake)",
            ],
        ),
        "missing_reduction": expect(
            all_reduce("missing_reduction", *rd),
            [
                "after step 0: every message matched the reference's, but rank 0's x[0] holds"
                " the sum of ranks {0} where the reference's holds the sum of ranks {0, 1}",
                "should hold the sum of ranks {0, 1, 2, 3}",
            ],
        ),
    }
