"""The lessons' runnable halves: one module per chapter of the lecture, run under the launcher.

    minipar lesson list                 the table below
    minipar lesson 03 -n 4              minipar.course.lessons.l03_ring_and_tree on 4 ranks
    minipar lesson 03 --break wrong-chunk    the lesson's break-it lab

The text of each lesson is `lessons/NN_name.md` at the top of the repository. Every module first
prints its prediction (the cost model, the formulas), then measures or shows what really moved,
and exits non-zero if a check fails. Only rank 0 prints. Importing this package is light: the
catalogue is plain data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LessonInfo:
    number: str  # "01"
    name: str  # the text's file name without .md: "01_hierarchy"
    title: str
    ranks: int  # default number of ranks
    shows: str  # one line: what it prints
    module: str  # the runnable module
    breaks: tuple[str, ...] = ()  # names of its break-it labs
    min_ranks: int = 1

    @property
    def text(self) -> str:
        """The lesson text's path relative to the repository root."""
        return f"lessons/{self.name}.md"


LESSONS = [
    LessonInfo(
        "01",
        "01_hierarchy",
        "Why parallelism, and the hierarchy",
        2,
        "bytes of a 7B/70B model vs one GPU's HBM; links from HBM to InfiniBand; this machine",
        "minipar.course.lessons.l01_hierarchy",
        (),
        min_ranks=2,
    ),
    LessonInfo(
        "02",
        "02_collectives",
        "Ranks, point-to-point and the collective zoo",
        4,
        "a ring shift and eight collectives moving data on 4 ranks, before and after",
        "minipar.course.lessons.l02_collectives",
        ("send-first",),
        min_ranks=2,
    ),
    LessonInfo(
        "03",
        "03_ring_and_tree",
        "Ring and tree algorithms",
        4,
        "ring all-reduce step by step, trees, recursive doubling, ledger vs formulas, crossover",
        "minipar.course.lessons.l03_ring_and_tree",
        ("wrong-chunk", "last-bit"),
        min_ranks=2,
    ),
    LessonInfo(
        "04",
        "04_topology_bandwidth",
        "Topology and bandwidth",
        2,
        "a bench on this machine (algbw, busbw, roofline), the model on NVLink and InfiniBand",
        "minipar.course.lessons.l04_topology_bandwidth",
        ("no-wait",),
        min_ranks=2,
    ),
    # written with their capability issues, on the same framework
    LessonInfo(
        "05",
        "05_data_parallel",
        "Data parallelism: DDP, ZeRO, FSDP",
        2,
        "gradients all-reduced, optimizer state sharded",
        "minipar.course.lessons.l05_data_parallel",
        ("tied-twice",),
    ),
    LessonInfo(
        "06",
        "06_tensor_parallel",
        "Tensor parallelism",
        2,
        "column and row parallel layers, f and g, a layer's all-reduces counted, NVLink vs IB",
        "minipar.course.lessons.l06_tensor_parallel",
        ("bias-every-rank",),
        min_ranks=2,
    ),
    LessonInfo(
        "07",
        "07_pipeline_parallel",
        "Pipeline parallelism",
        4,
        "stages, micro-batches and the bubble: GPipe, 1F1B, interleaved, zero bubble, measured",
        "minipar.course.lessons.l07_pipeline_parallel",
        ("dp-warmup",),
        min_ranks=2,
    ),
    LessonInfo(
        "08",
        "08_putting_it_together",
        "Putting it together: DP x TP x PP",
        8,
        "a tiny GPT on a 3D mesh",
        "minipar.course.lessons.l08_putting_it_together",
    ),
    LessonInfo(
        "09",
        "09_context_parallel",
        "Long sequences: context parallelism",
        4,
        "ring attention's K/V bytes, the causal work per rank, memory / cp, ring vs Ulysses",
        "minipar.course.lessons.l09_context_parallel",
        ("forget-rescale", "naive-split"),
        min_ranks=2,
    ),
    LessonInfo(
        "10",
        "10_mixture_of_experts",
        "Mixture of experts: expert parallelism",
        2,
        "an MoE layer's all-to-alls against an all-reduce, imbalance, aux loss, capacity drops",
        "minipar.course.lessons.l10_mixture_of_experts",
        ("no-counts", "wrong-group"),
        min_ranks=2,
    ),
    LessonInfo(
        "11",
        "11_at_scale",
        "At scale: a simulated cluster",
        2,
        "ring vs tree vs double tree to 8,192 ranks, one ring vs one per NIC, simulated",
        "minipar.course.lessons.l11_at_scale",
    ),
    LessonInfo(
        "12",
        "12_failures_at_scale",
        "Failures at scale: checkpoints and restarts",
        1,
        "MTBI from Llama 3's failure rate, the Young/Daly interval, a save's cost, goodput",
        "minipar.course.lessons.l12_failures_at_scale",
    ),
]


def find(key: str) -> LessonInfo:
    """A lesson by number ("3", "03") or by name ("03_ring_and_tree", "ring_and_tree")."""
    key = key.strip()
    for lesson in LESSONS:
        if key.isdigit() and int(key) == int(lesson.number):
            return lesson
        if key in (lesson.name, lesson.name[3:]):
            return lesson
    numbers = ", ".join(lesson.number for lesson in LESSONS)
    raise ValueError(f"no lesson {key!r}; the lessons are {numbers} (minipar lesson list)")
