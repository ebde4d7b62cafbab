"""On emulated nodes (minipar run --nodes; tests/test_cluster.py): every rank knows its node, the
bytes between nodes cross the shaped link and those inside a node do not, a ping-pong across
the link is timed against raw mpi4py's, and every collective gives the same bits as on one node.

Run on one node too: there the facts say one node, and the digests are the reference the
emulated run must match bit for bit.
"""

import hashlib
import os
import socket
import time

import numpy as np

import minipar
from minipar.collectives import api
from minipar.errors import MiniparError
from minipar.launcher.cluster import mpi_args

DIGESTED = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast", "reduce")


def world():
    return minipar.init()


def eth0_bytes() -> tuple[int, int] | None:
    """(sent, received) on this node's eth0, from this process's network namespace
    (/proc/self/net/dev: /sys would show the machine's own interfaces), or None on one node."""
    with open("/proc/self/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "eth0":
                fields = rest.split()
                return int(fields[8]), int(fields[0])
    return None


def emulated() -> bool:
    return "MINIPAR_EMULATED_NODES" in os.environ


def facts_case():
    comm = world()
    rank, nodes = comm.rank, minipar.runtime.nodes.nodes()
    node, n_nodes = minipar.node_rank(), minipar.num_nodes()
    print(f"FACTS rank={rank} node={node} of {n_nodes} host={socket.gethostname()}")
    assert minipar.node_map() == list(nodes.node_of)
    on_node = [r for r in range(comm.size) if nodes.node_of[r] == node]
    assert minipar.local_rank() == on_node.index(rank), (minipar.local_rank(), on_node)
    assert minipar.local_world_size() == len(on_node)
    if emulated():
        assert socket.gethostname() == f"node{node}", socket.gethostname()
        assert socket.gethostbyname("node0") == "10.200.0.1"  # node names resolve on a node
        assert nodes.names[node] == f"node{node}"
        counts = mpi_args.slots(comm.size, n_nodes)  # consecutive ranks on a node, in blocks
        assert node == next(k for k in range(n_nodes) if rank < sum(counts[: k + 1])), counts
        said = (os.environ.get("MPI_LOCALRANKID") or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
                or os.environ.get("SLURM_LOCALID"))  # hydra, prterun, srun  # fmt: skip
        assert int(said) == minipar.local_rank(), (said, minipar.local_rank())
    else:
        assert n_nodes == 1 and node == 0


def bytes_between_nodes(t, node_of, me) -> int:
    """What this rank sent to ranks on other nodes, from the ledger (world group ranks)."""
    return sum(m.nbytes for m in t.messages if m.kind == "send" and node_of[m.peer] != node_of[me])


def link_bytes_case():
    """A ring all-reduce of 8 MiB over the world: what each node's eth0 sent equals what the
    ledger says its ranks sent to other nodes, plus TCP/IP's headers and acknowledgements
    (<= 2% at MTU 9000, and a 64 KiB floor for the job's own chatter)."""
    comm = world()
    node_of = minipar.runtime.nodes.nodes().node_of
    x = np.ones(2 << 20, dtype=np.float32)
    minipar.barrier()
    before = eth0_bytes()
    minipar.barrier()  # every rank read `before` first: a peer's first sends come after it
    with minipar.trace() as t:
        minipar.all_reduce(x, algorithm="ring")
    minipar.barrier()
    after = eth0_bytes()
    assert np.all(x == comm.size)
    crossing = bytes_between_nodes(t, node_of, comm.rank)
    totals = [0] * comm.size
    minipar.all_gather_object(totals, crossing)
    node_total = sum(c for r, c in enumerate(totals) if node_of[r] == node_of[comm.rank])
    print(f"LINK rank={comm.rank} ledger_node={node_total} eth0={after and after[0] - before[0]}")
    if before is None:
        assert node_total == 0
        return
    sent = after[0] - before[0]
    assert node_total > 0
    assert node_total <= sent <= 1.02 * node_total + 64 * 1024, (sent, node_total)


def inside_node_case():
    """An all-reduce of 8 MiB on each node's own group puts (almost) nothing on the link."""
    comm = world()
    groups = minipar.runtime.node_groups()
    x = np.ones(2 << 20, dtype=np.float32)
    minipar.barrier()
    before = eth0_bytes()
    minipar.barrier()
    minipar.all_reduce(x, group=groups.intra, algorithm="ring")
    groups.intra.barrier()
    after = eth0_bytes()
    assert np.all(x == minipar.local_world_size())
    if before is not None:
        assert after[0] - before[0] < 64 * 1024, after[0] - before[0]
    minipar.barrier()
    del comm


EXCHANGE_BYTES, EXCHANGES, IDLE = 1 << 20, 12, 0.002


def exchange_across_case():
    """Rank 0 and node1's first rank ping-pong 1 MiB with minipar's send/recv and with raw
    mpi4py Send/Recv in turns, an idle pause before each (as between a step's collectives),
    while the other ranks wait in minipar's barrier; rank 0 prints every round trip. The pytest
    side holds minipar's against the wire and raw's (issue 62: waits that napped between polls
    starved the link, which moves bytes only while polled)."""
    from mpi4py import MPI

    comm = world()
    if minipar.num_nodes() < 2:
        return  # on one node nothing crosses a link
    peer = minipar.node_map().index(1)  # node1's first rank
    raw = MPI.COMM_WORLD.Dup()  # raw Recv takes any tag: on the world it could take minipar's
    if comm.rank in (0, peer):
        other, first = (peer, True) if comm.rank == 0 else (0, False)
        buf = np.zeros(EXCHANGE_BYTES, dtype=np.uint8)
        ways = {
            "minipar": (comm.send, comm.recv),
            "raw": (
                lambda b, p: raw.Send([b, MPI.BYTE], p),
                lambda b, p: raw.Recv([b, MPI.BYTE], p),
            ),
        }
        times = {name: [] for name in ways}
        for _ in range(EXCHANGES + 1):  # the first is a warm-up
            for name, (send, recv) in ways.items():
                time.sleep(IDLE)
                start = time.perf_counter()
                for step in (send, recv) if first else (recv, send):
                    step(buf, other)
                times[name].append(time.perf_counter() - start)
        if comm.rank == 0:
            for name, seconds in times.items():
                print(f"EXCHANGE {name} " + " ".join(f"{t:.6f}" for t in seconds[1:]))
    raw.Free()
    minipar.barrier()


def windows_stay_inside_case():
    """A shared-memory window cannot span nodes: forced on the world it is refused with a
    clear error (on every rank, before any byte moves), on a node's own group it works."""
    world()
    groups = minipar.runtime.node_groups()
    x = np.ones(1 << 16, dtype=np.float32)
    minipar.all_reduce(x, group=groups.intra, algorithm="ring@shm")
    assert np.all(x == minipar.local_world_size())
    if minipar.num_nodes() > 1:
        try:
            minipar.all_reduce(x, algorithm="ring@shm")
        except MiniparError as error:
            assert "span nodes" in str(error), error
        except ValueError as error:
            assert "span nodes" in str(error), error
        else:
            raise AssertionError("ring@shm across nodes was not refused")
    minipar.barrier()


def digest_case():
    """Every reducing and moving collective x algorithm on deterministic float32 data (sums
    whose rounding depends on the order): the digest of each result, printed. The pytest side
    compares the digests of the run on emulated nodes with those of the run on one node."""
    comm = world()
    p, rank = comm.size, comm.rank
    lines = []
    for collective in DIGESTED:
        for algorithm in api.algorithms(collective):
            if algorithm == "auto" or "@" in algorithm:
                continue
            if algorithm.startswith("hierarchical") and collective in (
                "all_reduce",
                "reduce_scatter_tensor",
            ):
                continue  # sums inside each node first: another order across nodes, by design
            out = _run(collective, algorithm, p, rank)
            digest = hashlib.sha256(out.tobytes()).hexdigest()[:16]
            lines.append(f"DIGEST {collective}.{algorithm} {digest}")
    print("\n".join(lines))


def _run(collective, algorithm, p, rank):
    rng = np.random.default_rng(17 + rank)
    count = 1000 * p + 7  # not a multiple of p where the collective allows it
    x = rng.standard_normal(count).astype(np.float32)
    if collective == "all_reduce":
        minipar.all_reduce(x, algorithm=algorithm)
        return x
    if collective == "broadcast":
        minipar.broadcast(x, src=p - 1, algorithm=algorithm)
        return x
    if collective == "reduce":
        minipar.reduce(x, dst=0, algorithm=algorithm)
        return x if rank == 0 else np.zeros(1, np.float32)
    if collective == "reduce_scatter_tensor":
        x = rng.standard_normal(1000 * p).astype(np.float32)
        out = np.empty(1000, np.float32)
        minipar.reduce_scatter_tensor(out, x, algorithm=algorithm)
        return out
    out = np.empty(count * p, np.float32)
    minipar.all_gather_into_tensor(out, x, algorithm=algorithm)
    return out


def cases(size):
    return {
        "facts": facts_case,
        "link_bytes": link_bytes_case,
        "inside_node": inside_node_case,
        "exchange_across": exchange_across_case,
        "windows_stay_inside": windows_stay_inside_case,
        "digest": digest_case,
    }
