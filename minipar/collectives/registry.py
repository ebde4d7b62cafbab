"""Which algorithms each collective has, and how `algorithm=` picks one.

Schedules are data: this table is the whole list. `algorithms("all_reduce")` reads it, `auto`
asks minipar.cost for the cheapest entry, and a student's own function joins it with
`register_algorithm("all_reduce", "my_ring", fn)` (or is passed directly as `algorithm=fn`).
"""

from __future__ import annotations

from minipar import cost
from minipar.collectives import (
    bruck,
    double_tree,
    hierarchical,
    linear,
    pairwise,
    pipelined,
    recursive,
    ring,
    tree,
)
from minipar.collectives.barrier import barrier_dissemination

ALGORITHMS = {
    "broadcast": {
        "linear": linear.broadcast_linear,
        "tree": tree.broadcast_tree,
        "ring": ring.broadcast_ring,
        "hierarchical": hierarchical.broadcast_hierarchical,
    },
    "reduce": {"linear": linear.reduce_linear, "tree": tree.reduce_tree},
    "all_reduce": {
        "linear": linear.all_reduce_linear,
        "tree": tree.all_reduce_tree,
        "ring": ring.all_reduce_ring,
        "recursive_doubling": recursive.all_reduce_recursive_doubling,
        "rabenseifner": recursive.all_reduce_rabenseifner,
        "double_tree": double_tree.all_reduce_double_tree,
        "hierarchical": hierarchical.all_reduce_hierarchical,
        "hierarchical_pipelined": pipelined.all_reduce_hierarchical_pipelined,
    },
    "all_gather": {
        "linear": linear.all_gather_linear,
        "ring": ring.all_gather_ring,
        "recursive_doubling": recursive.all_gather_recursive_doubling,
        "bruck": bruck.all_gather_bruck,
        "hierarchical": hierarchical.all_gather_hierarchical,
    },
    "reduce_scatter": {
        "linear": linear.reduce_scatter_linear,
        "ring": ring.reduce_scatter_ring,
        "recursive_halving": recursive.reduce_scatter_recursive_halving,
        "hierarchical": hierarchical.reduce_scatter_hierarchical,
    },
    "scatter": {"linear": linear.scatter_linear, "tree": tree.scatter_tree},
    "gather": {"linear": linear.gather_linear, "tree": tree.gather_tree},
    "all_to_all": {"linear": linear.all_to_all_linear, "pairwise": pairwise.all_to_all_pairwise},
    "barrier": {"dissemination": barrier_dissemination},
}

# the torch.distributed names of the same collectives
ALIASES = {
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
}
BUILTIN = {name: frozenset(table) for name, table in ALGORITHMS.items()}  # minipar's own names


_AUTO_CACHE: dict = {}  # (collective, nbytes, size, nodes) -> (links, name): auto's answers
# priced only where a group spans nodes (on one node they are the ring: never auto's there)
TWO_LEVEL = ("hierarchical", "hierarchical_pipelined")


def canonical(collective: str) -> str:
    name = ALIASES.get(collective, collective)
    if name not in ALGORITHMS:
        raise ValueError(
            f"unknown collective {collective!r}; choose one of {', '.join(sorted(ALGORITHMS))}"
        )
    return name


def algorithms(collective: str) -> list[str]:
    """The names `algorithm=` accepts for this collective, "auto" first."""
    return ["auto", *ALGORITHMS[canonical(collective)]]


def register_algorithm(collective: str, name: str, fn) -> None:
    """Add (or replace) a user algorithm; fn(call, ...) has the built-ins' signature."""
    collective = canonical(collective)
    if name == "auto" or name in BUILTIN[collective]:
        raise ValueError(f"{name!r} is a built-in {collective} algorithm; pick another name")
    ALGORITHMS[collective][name] = fn


def pick(collective: str, algorithm, nbytes: int, size: int, comm=None):
    """(name, function) for a call; "auto" asks the cost model, among the built-ins (for
    `comm`, a group that spans nodes of equal size, on the in-node and between-node links)."""
    collective = canonical(collective)
    table = ALGORITHMS[collective]
    if callable(algorithm):
        return getattr(algorithm, "__name__", "custom"), algorithm
    if isinstance(algorithm, str) and "@" in algorithm:  # "ring@shm": see fast/routing.py
        base, forced = split(algorithm)
        name, fn = pick(collective, base, nbytes, size, comm)
        return f"{name}@{forced}", fn
    if algorithm == "auto":
        shape = hierarchical.shape(comm) if comm is not None else None
        links = (cost.default_link(), cost.inter_link() if shape else None)
        key = (collective, nbytes, size, shape)
        hit = _AUTO_CACHE.get(key)
        if hit is None or hit[0] != links:  # a new size, or a new default link
            if len(_AUTO_CACHE) > 4096:
                _AUTO_CACHE.clear()
            hit = _AUTO_CACHE[key] = (links, auto_choice(collective, nbytes, size, shape, links))
        return hit[1], table[hit[1]]
    if algorithm not in table:
        import difflib  # here: only a misspelt name needs it

        close = difflib.get_close_matches(str(algorithm), algorithms(collective), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown {collective} algorithm {algorithm!r}{hint}; choose one of "
            f"{', '.join(algorithms(collective))}"
        )
    return algorithm, table[algorithm]


def auto_choice(collective: str, nbytes: int, size: int, shape, links) -> str:
    """The cost model's pick: on one node (or unequal nodes) among the flat algorithms on the
    default link; on `shape` = (nodes, per_node), every built-in on `links` = (inside, between):
    the two-level all-reduce, or its pipelined form where the model prices that faster (large
    buffers: cost.pipelined_all_reduce). Ties on one node go to the ring. A function of its
    arguments only, so ranks that agree on the links (runtime/nodes.py checks at init) pick the
    same."""
    names = sorted(BUILTIN[collective])
    if shape is None:
        # ties among ranks that talk go to the ring (cost.choose keeps the first listed): on 2
        # ranks Rabenseifner's messages are the ring's, and the fast forms are the ring's
        flat = [a for a in names if a not in TWO_LEVEL]
        if size > 1:
            flat.sort(key=lambda a: a != "ring")
        return cost.choose(collective, flat, nbytes, size, links[0])
    return cost.choose_on_nodes(collective, names, nbytes, *shape, *links)


def split(name: str) -> tuple[str, str]:
    """'ring@shm' -> ('ring', 'shm'); 'ring' -> ('ring', ''): an algorithm forced onto a
    transport (collectives/fast/routing.py carries it)."""
    base, _, forced = name.partition("@")
    if forced and forced not in ("mpi", "shm"):
        raise ValueError(f"unknown transport {forced!r} in algorithm {name!r}; use @mpi or @shm")
    return base, forced
