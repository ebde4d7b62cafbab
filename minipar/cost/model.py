"""The alpha-beta-gamma cost model: how long a collective should take, from three numbers.

    time = steps * alpha  +  bytes_sent * beta  +  (bytes_reduced + bytes_copied) * gamma

alpha is the cost of one message (latency), beta the cost of one byte on the link (1/bandwidth),
gamma the cost of reducing one byte (1/reduction rate). Local copies (a scratch buffer filled
from the input, a final rotation) are one pass over memory like a reduction, and are priced at
gamma too: without them `auto` could not tell a ring all-gather from Bruck's, which sends the
same bytes in as many steps on 2 ranks but copies the whole output once more. `traffic()` counts
steps and bytes for
each (collective, algorithm) from the same formulas the algorithms' docstrings state and the
tests check against the trace ledger; `predict()` prices them on a `Link`.
(Hockney 1994; Thakur, Rabenseifner and Gropp 2005; Patarasuk and Yuan 2009.)

nbytes is the size of the whole buffer, as in nccl-tests: the vector being reduced or broadcast,
the full output of an all-gather, the full input of a reduce-scatter, the root's buffer of a
scatter or gather, one rank's whole send buffer of an all-to-all.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, replace

from minipar.cost.links import (
    DGX_B200,
    SHM_LINK_ENV,
    Hierarchy,
    Link,
    default_link,
    inter_link,
    shm_link,
)

SEGMENT_BYTES = 1 << 18  # must match collectives.ring.SEGMENT_BYTES (checked by a test)


TWO_LEVEL_NAMES = ("hierarchical", "hierarchical_pipelined")
MAX_CHUNKS = 64  # pieces of the pipelined two-level all-reduce, at most


@dataclass(frozen=True)
class Traffic:
    steps: int  # rounds of the algorithm (the ledger's steps, max over ranks)
    bytes_sent: float  # by the busiest rank
    bytes_reduced: float  # by the busiest rank
    exact: bool = True  # False: bytes_sent is an upper bound (uneven splits, folded ranks)
    bytes_copied: float = 0.0  # local copies by the busiest rank (root 0 where there is one)


def _log2ceil(p: int) -> int:
    return (p - 1).bit_length()


def _fold(p: int) -> tuple[int, int]:
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2


def _doubling_blocks(p: int) -> int:
    """Blocks the busiest rank sends in a folded recursive-doubling all-gather's butterfly: in
    step k, participant 0's group of 2^k stands for 2^k + min(2^k, rem) ranks' blocks."""
    p2, rem = _fold(p)
    return sum((1 << k) + min(1 << k, rem) for k in range(p2.bit_length() - 1))


def traffic(collective: str, algorithm: str, nbytes: float, p: int) -> Traffic:
    """Steps and bytes of one call. Exact when p divides nbytes evenly, unless noted."""
    if algorithm in TWO_LEVEL_NAMES:  # on one node the two-level schemes are the ring alone
        algorithm = "ring"  # (across nodes: traffic_on_nodes)
    N, L = nbytes, _log2ceil(p)
    p2, rem = _fold(p)
    k2, extra = p2.bit_length() - 1, 1 if rem else 0
    if p == 1:
        return Traffic(0, 0, 0)
    table = {
        ("broadcast", "linear"): (p - 1, (p - 1) * N, 0),
        ("broadcast", "tree"): (L, L * N, 0),
        ("broadcast", "ring"): (max(1, math.ceil(N / SEGMENT_BYTES)) + p - 2, N, 0),
        ("reduce", "linear"): (p - 1, N, (p - 1) * N),
        ("reduce", "tree"): (L, N, L * N),
        ("all_reduce", "linear"): (2 * (p - 1), (p - 1) * N, (p - 1) * N),
        ("all_reduce", "tree"): (2 * L, L * N, L * N),
        ("all_reduce", "ring"): (2 * (p - 1), 2 * (p - 1) / p * N, (p - 1) / p * N),
        ("all_reduce", "recursive_doubling"): (k2 + 2 * extra, (k2 + extra) * N, (k2 + extra) * N),
        ("all_reduce", "rabenseifner"): (
            2 * k2 + 2 * extra,
            2 * (p2 - 1) / p2 * N + extra * N,
            (p2 - 1) / p2 * N + extra * N,
        ),
        ("all_reduce", "double_tree"): (2 * (p.bit_length() - 1), 2 * N, N),
        ("all_gather", "linear"): (2 * (p - 1), (p - 1) * N, 0),
        ("all_gather", "ring"): (p - 1, (p - 1) / p * N, 0),
        ("all_gather", "recursive_doubling"): (
            k2 + 2 * extra,
            _doubling_blocks(p) * N / p + extra * N,
            0,
        ),
        ("all_gather", "bruck"): (L, (p - 1) / p * N, 0),
        ("reduce_scatter", "linear"): (2 * (p - 1), N, (p - 1) * N),
        ("reduce_scatter", "ring"): (p - 1, (p - 1) / p * N, (p - 1) / p * N),
        ("reduce_scatter", "recursive_halving"): (
            k2 + 2 * extra,
            extra * N + (p - 1) / p * N,
            (p - 1) / p * N + extra * N,
        ),
        ("scatter", "linear"): (p - 1, (p - 1) / p * N, 0),
        ("scatter", "tree"): (L, (p - 1) / p * N, 0),
        ("gather", "linear"): (p - 1, N / p, 0),
        ("gather", "tree"): (L, max(min(1 << k, p - (1 << k)) for k in range(L)) * N / p, 0),
        ("all_to_all", "linear"): (p - 1, (p - 1) / p * N, 0),
        ("all_to_all", "pairwise"): (p - 1, (p - 1) / p * N, 0),
        ("barrier", "dissemination"): (L, 0, 0),
    }
    try:
        steps, sent, reduced = table[(collective, algorithm)]
    except KeyError:
        raise ValueError(f"no cost formula for {collective} with algorithm {algorithm!r}") from None
    inexact = algorithm == "double_tree" or (
        rem and algorithm in ("recursive_doubling", "recursive_halving")
    )
    return Traffic(steps, sent, reduced, not inexact, _copied(collective, algorithm, N, p))


def _copied(collective: str, algorithm: str, N: float, p: int) -> float:
    """Bytes the busiest rank copies locally, outside messages (read from the algorithms)."""
    n = N / p  # one rank's block
    copies = {
        ("reduce", "tree"): N if p >= 4 else 0,  # an inner node keeps x: works on a copy
        ("all_reduce", "tree"): N if p >= 4 else 0,
        ("all_gather", "linear"): n,  # the own block into the output
        ("all_gather", "ring"): n,
        ("all_gather", "recursive_doubling"): n,
        ("all_gather", "bruck"): n + N,  # into scratch, then the rotation into rank order
        ("reduce_scatter", "linear"): N + n,  # the input into scratch; the root's block out
        ("reduce_scatter", "recursive_halving"): N + n,
        ("scatter", "linear"): n,
        ("scatter", "tree"): n,
        ("gather", "linear"): n,
        ("gather", "tree"): N + n,  # the root's own block, then the unrotation
        ("all_to_all", "linear"): n,
        ("all_to_all", "pairwise"): n,
    }
    return copies.get((collective, algorithm), 0)


def predict(collective: str, algorithm: str, nbytes: float, world_size: int, link=None) -> float:
    """Seconds for one call: steps alpha + bytes_sent beta + (bytes_reduced + copied) gamma."""
    link = link or default_link()
    t = traffic(collective, algorithm, nbytes, world_size)
    local = t.bytes_reduced + t.bytes_copied
    return t.steps * link.alpha + t.bytes_sent * link.beta + local * link.gamma


def choose(collective: str, candidates, nbytes: float, world_size: int, link=None) -> str:
    """The candidate algorithm with the lowest predicted time (ties: the first listed).

    Every `algorithm="auto"` call asks this, so answers are cached (pricing all candidates
    costs tens of microseconds of Python, more than a small all-reduce itself)."""
    return _choose(collective, tuple(candidates), nbytes, world_size, link or default_link())


@functools.lru_cache(maxsize=4096)
def _choose(collective: str, candidates: tuple, nbytes: float, world_size: int, link) -> str:
    return min(candidates, key=lambda a: predict(collective, a, nbytes, world_size, link))


def crossover(collective: str, small: str, large: str, world_size: int, link=None):
    """The message size (bytes) above which `large` is predicted faster than `small`, or None
    if one wins at every size from 1 B to 1 TiB. Bisection on the sign of the difference."""

    def large_wins(n: float) -> bool:
        return predict(collective, large, n, world_size, link) < predict(
            collective, small, n, world_size, link
        )

    lo, hi = 1.0, float(1 << 40)
    if large_wins(lo) or not large_wins(hi):
        return None
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if large_wins(mid) else (mid, hi)
    return hi


SHM_MIN_BYTES = 64 << 10  # `auto` keeps smaller messages on MPI: latency, not copies, rules


def shm_traffic(collective: str, nbytes: float, p: int, in_place: bool = False) -> Traffic:
    """Waits, bytes copied through the windows and bytes reduced by one rank of the single-copy
    schedules (collectives/fast/windows.py; with in_place, of a buffer that lives in the window
    already: fast/in_place.py, nothing copied in); bytes_sent counts copies, priced at beta."""
    N, c = nbytes, (p - 1) / p * nbytes
    table = {
        "all_reduce": (3, c + N / p + c, c),  # publish p-1 chunks, my result, copy p-1 out
        "all_gather": (2, N / p + N, 0),  # publish my block; my block and p-1 others out
        "reduce_scatter": (2, c, c),  # publish p-1 blocks; reduce mine from p copies
    }
    if in_place:
        table = {
            "all_reduce": (4, c, c),  # reduce my chunk where it lies, copy p-1 chunks out
            "all_gather": (3, N / p + c, 0),  # my block into place, p-1 others out
            "reduce_scatter": (3, 0, c),  # reduce my block from the p buffers
        }
    steps, copied, reduced = table[collective]
    return Traffic(steps, copied, reduced)


def predict_shm(collective: str, nbytes: float, p: int, link=None, in_place=False) -> float:
    link = link or shm_link()
    t = shm_traffic(collective, nbytes, p, in_place)
    return t.steps * link.alpha + t.bytes_sent * link.beta + t.bytes_reduced * link.gamma


def prefers_shm(collective: str, algorithm: str, nbytes: float, p: int, mpi=None, shm=None):
    """Whether the shared windows beat `algorithm` over MPI messages for this call. Only a
    measured window link can say so (MINIPAR_SHM_LINK, from `minipar bench --fit`, or `shm=`):
    until then `auto` keeps every call on MPI, the reference, whose messages the ledger counts."""
    if nbytes < SHM_MIN_BYTES or (shm is None and not os.environ.get(SHM_LINK_ENV)):
        return False
    return _prefers_shm(collective, algorithm, nbytes, p, mpi or default_link(), shm or shm_link())


@functools.lru_cache(maxsize=4096)
def _prefers_shm(collective, algorithm, nbytes, p, mpi, shm) -> bool:
    return predict_shm(collective, nbytes, p, shm) < predict(collective, algorithm, nbytes, p, mpi)


def all_reduce_on_cluster(
    nbytes: float, nodes: int, algorithm: str = "hierarchical", hierarchy: Hierarchy = DGX_B200
) -> float:
    """Seconds to all-reduce nbytes on every GPU of `nodes` nodes.

    "ring": one flat ring over all p = nodes * per_node GPUs. Every step moves n/p bytes over
    every link at once and ends when the slowest lands, so with more than one node each of the
    2 (p-1) steps costs an InfiniBand hop: 2 (p-1) (alpha_ib + n/p beta_ib).
    "hierarchical": ring reduce-scatter inside each node (NVLink), then each GPU all-reduces its
    n/per_node shard with the same-numbered GPU of every other node (per_node rings at once, one
    per NIC), then ring all-gather inside the node. InfiniBand carries per_node times fewer bytes
    per GPU: 2 (m-1)/m * n/per_node instead of 2 (p-1)/p * n.
    """
    h, g = hierarchy, hierarchy.per_node
    p = nodes * g
    if algorithm == "ring":
        slow = h.inter if nodes > 1 else h.intra
        link = Link("flat", slow.alpha, slow.beta, h.intra.gamma)
        return predict("all_reduce", "ring", nbytes, p, link)
    if algorithm != "hierarchical":
        raise ValueError(f"algorithm must be 'ring' or 'hierarchical', got {algorithm!r}")
    # the ring all-reduce in a node is its reduce-scatter and its all-gather, in place: the
    # cross-node step goes between the two and changes neither's cost
    inside = predict("all_reduce", "ring", nbytes, g, h.intra)
    across = predict("all_reduce", "ring", nbytes / g, nodes, h.inter) if nodes > 1 else 0.0
    return inside + across


# -- a group that spans nodes: two links ------------------------------------------------------
TWO_LEVEL = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")  # have "hierarchical"


def traffic_on_nodes(collective: str, algorithm: str, nbytes: float, nodes: int, per_node: int):
    """(inside, between): the steps and bytes of one call on `nodes` nodes of `per_node` ranks
    (consecutive group ranks on a node), split by the link they use.

    "hierarchical": the table in collectives/hierarchical.py, per level; exact when p divides
    the element count. "hierarchical_pipelined" (all-reduce): the same bytes; its steps are
    hierarchical's here (its own count, and its time: pipelined_all_reduce). A flat algorithm:
    every one of its steps has a message between nodes (a ring's crossing rank sends all its
    bytes across), so all of it is priced on the slow link; exact (busiest rank) for the ring,
    an upper bound for the others."""
    N, k, S = nodes, per_node, nbytes
    p = N * k
    if algorithm == "hierarchical_pipelined" and collective == "all_reduce":
        algorithm = "hierarchical"  # the same bytes; its steps: pipelined_all_reduce
    if algorithm != "hierarchical" or N == 1:
        flat = traffic(collective, algorithm, S, p)
        if N == 1:
            return flat, Traffic(0, 0, 0)
        return Traffic(0, 0, 0), replace(flat, exact=flat.exact and algorithm == "ring")
    if collective not in TWO_LEVEL:
        raise ValueError(f"no two-level {collective}; it has {', '.join(TWO_LEVEL)}")
    if collective == "broadcast":
        return _chain(S, k, 0 if k == 1 else S), _chain(S, N, S)
    shard = S / k  # what each rank takes across nodes (all-reduce, reduce-scatter)
    inside = {
        "all_reduce": Traffic(2 * (k - 1), 2 * (k - 1) / k * S, (k - 1) / k * S),
        "reduce_scatter": Traffic(k - 1, (k - 1) / k * S, (k - 1) / k * S, True, S),
        "all_gather": Traffic(k - 1, (k - 1) / k * S, 0, True, S / p + S),
    }[collective]
    between = {
        "all_reduce": Traffic(2 * (N - 1), 2 * (N - 1) / N * shard, (N - 1) / N * shard),
        "reduce_scatter": Traffic(N - 1, (N - 1) / N * shard, (N - 1) / N * shard),
        "all_gather": Traffic(N - 1, (N - 1) * S / p, 0),
    }[collective]
    return inside, between


def _chain(nbytes: float, p: int, sent: float) -> Traffic:
    """A pipelined chain broadcast over p ranks (ring.broadcast_ring)."""
    steps = max(1, math.ceil(nbytes / SEGMENT_BYTES)) + p - 2 if p > 1 else 0
    return Traffic(steps, sent if p > 1 else 0, 0)


def _price(t: Traffic, link: Link, gamma: float) -> float:
    local = t.bytes_reduced + t.bytes_copied
    return t.steps * link.alpha + t.bytes_sent * link.beta + local * gamma


def predict_on_nodes(
    collective: str,
    algorithm: str,
    nbytes: float,
    nodes: int,
    per_node: int,
    intra=None,
    inter=None,
    links_per_node: int = 1,
) -> float:
    """Seconds for one call on a group that spans `nodes` nodes of `per_node` ranks: the part
    inside a node priced on `intra` (default: default_link()), the part between on `inter`
    (default: links.inter_link()); reductions and copies at intra's gamma.

    `inter` is one node's link, shared by the ranks that cross at once (`links_per_node` of
    them go at full rate: 1 for an emulated node's one cable, 8 for a DGX's NIC per GPU). The
    two-level schemes send from all k ranks of a node at once, so their bytes between nodes
    cost k / links_per_node times one rank's; a flat ring (and a broadcast) crosses from one
    rank a node; the butterflies and trees may cross from all k at once (recursive doubling's
    far steps do), priced so: an upper bound. Measured on 2 emulated nodes of 2 on a 2 Gbit/s
    cable at 64 MiB: Rabenseifner 2.3x, the flat ring 1.5x the two-level all-reduce's time."""
    intra, inter = intra or default_link(), inter or inter_link()
    if algorithm == "hierarchical_pipelined" and nodes > 1 and per_node > 1:
        C = pipeline_chunks(nbytes, nodes, per_node, intra, inter)
        return pipelined_all_reduce(nbytes, nodes, per_node, C, intra, inter, links_per_node)
    if algorithm == "hierarchical_pipelined":  # the ring, or the ring across: hierarchical's
        algorithm = "hierarchical"
    inside, between = traffic_on_nodes(collective, algorithm, nbytes, nodes, per_node)
    if algorithm != "ring" and collective != "broadcast":  # k ranks a node cross at once
        share = max(1.0, per_node / links_per_node)
        between = replace(between, bytes_sent=between.bytes_sent * share)
    return _price(inside, intra, intra.gamma) + _price(between, inter, intra.gamma)


def choose_on_nodes(collective, candidates, nbytes, nodes, per_node, intra=None, inter=None):
    """The candidate with the lowest predict_on_nodes. Ties (within rounding) go to
    "hierarchical": with both links priced alike it can equal a flat algorithm (2 x 2:
    Rabenseifner's steps and bytes), but it keeps part of its bytes inside the node."""
    return _choose_on_nodes(
        collective, tuple(candidates), nbytes, nodes, per_node,
        intra or default_link(), inter or inter_link(),
    )  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _choose_on_nodes(collective, candidates, nbytes, nodes, per_node, intra, inter) -> str:
    times = {
        a: predict_on_nodes(collective, a, nbytes, nodes, per_node, intra, inter)
        for a in candidates
    }
    best = min(times.values())
    first = sorted(candidates, key=lambda a: a != "hierarchical")  # stable: the rest in order
    return next(a for a in first if times[a] <= best * (1 + 1e-9))


# -- the two-level all-reduce, pipelined (collectives/pipelined.py) -----------------------------
def pipelined_all_reduce(
    nbytes: float, nodes: int, per_node: int, chunks: int, intra=None, inter=None, links_per_node=1
) -> float:
    """Seconds for the pipelined two-level all-reduce of nbytes in `chunks` pieces.

    One piece is s = S / C bytes. Its three stages, per rank (N nodes of k ranks):

        reduce-scatter inside  (k-1) steps of N messages   sends (k-1)/k s    reduces (k-1)/k s
        all-reduce across      2 (N-1) steps               sends 2 (N-1)/N s/k, reduces half that
        all-gather inside      (k-1) steps of N messages   sends (k-1)/k s

    priced alpha a message, beta a byte, gamma a byte reduced (inside: intra; across: inter,
    whose bytes cost k / links_per_node times one rank's: the node's k ranks cross at once).

    Only the bytes overlap. One thread posts every stage's messages of a step, then waits for
    them and reduces, so the messages' fixed costs add up, all (C+1) R + 2 (k-1) steps' worth:

        alphas = C (2 (k-1) N alpha_intra + 2 (N-1) alpha_inter)

    The bytes flow as a pipeline: the first piece goes through all three stages, each later one
    adds the slower of the node's link (both inside stages share it) and the link between:

        T(C) = alphas + b_rs + b_across + b_ag + (C-1) max(b_rs + b_ag, b_across)

    (b: a stage's bytes sent, reduced and copied for one piece, without its alphas.) In all, the
    bytes are hierarchical's (2 (k-1)/k S inside, 2 (N-1)/N S/k between). C = 1 is
    hierarchical's time plus 2 (k-1) (N-1) alphas inside (N messages a step, not 1); each more
    piece hides more of the node's work behind the link and costs a piece's alphas again, so
    small buffers (where alphas rule) stay with hierarchical. Measured on 2 emulated nodes of 2
    at 2 Gbit/s, a loaded machine (docs/cluster.md): no faster than hierarchical up to 4 MiB
    (up to 1.6x slower in 4 pieces), 0.7-0.8x its time at 16 and 64 MiB; priced as overlapped
    (max, not sum) the alphas put the crossover at 1 MiB."""
    intra, inter = intra or default_link(), inter or inter_link()
    N, k, s = nodes, per_node, nbytes / chunks
    share = max(1.0, k / links_per_node)
    alphas = chunks * (2 * (k - 1) * N * intra.alpha + 2 * (N - 1) * inter.alpha)
    b_rs = (k - 1) / k * s * (intra.beta + intra.gamma)
    b_ag = (k - 1) / k * s * intra.beta
    b_across = (N - 1) / N * s / k * (2 * inter.beta * share + intra.gamma)
    return alphas + b_rs + b_across + b_ag + (chunks - 1) * max(b_rs + b_ag, b_across)


def pipeline_chunks(nbytes: float, nodes: int, per_node: int, intra=None, inter=None) -> int:
    """The piece count 1..MAX_CHUNKS with the least pipelined_all_reduce time (ties: fewer)."""
    intra, inter = intra or default_link(), inter or inter_link()
    return _pipeline_chunks(nbytes, nodes, per_node, intra, inter)


@functools.lru_cache(maxsize=1024)
def _pipeline_chunks(nbytes, nodes, per_node, intra, inter) -> int:
    times = [
        pipelined_all_reduce(nbytes, nodes, per_node, c, intra, inter)
        for c in range(1, MAX_CHUNKS + 1)
    ]
    return 1 + times.index(min(times))
