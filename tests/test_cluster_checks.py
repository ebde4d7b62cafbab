"""The emulated cluster (minipar/launcher/cluster/) checked from outside its own code: a dead
job's folders of every kind found by a pattern written here, a cable's rate measured in both
directions against the rate asked for, ranks on 3 nodes of 2 placed where a hand-written table
says (and `auto` taking the two-level all-reduce there), launched from this process as from a
notebook; 2 nodes of 3 and unequal nodes under MINIPAR_EXTENDED=1 (CI's cluster step)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import pytest

from minipar.launcher.cluster import leftovers, needs
from minipar.launcher.cluster.nodes import EmulatedCluster, EmulationError, namespaces

EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"


def _can_emulate() -> str:
    lacks = needs.missing()
    if lacks:
        return "; ".join(lacks)
    try:
        with EmulatedCluster(1, "unlimited"):
            pass
    except EmulationError as error:
        return str(error)
    return ""


WHY_NOT = _can_emulate()
emulation = pytest.mark.skipif(bool(WHY_NOT), reason=f"no emulated nodes here: {WHY_NOT}")


# -- a dead job's folders ------------------------------------------------------------------------
def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_sweep_removes_every_kind_of_a_dead_jobs_folder(tmp_path, monkeypatch):
    """The folders a job makes in the temporary directory, named as their makers name them
    (relay.py: minipar-io-PID-*, the nodes' files: minipar-PID-JOB-files-*): a dead owner's
    are all removed, a live owner's and other programs' kept. Namespaces are left out here: a
    SIGKILL test beside this one may be counting its own dead ones."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(leftovers, "stale", lambda: [])
    dead, live = _dead_pid(), os.getpid()
    made = {
        f"minipar-io-{dead}-k3j2": False,  # False: must be swept
        f"minipar-{dead}-a1b2c3-files-9x": False,
        f"minipar-io-{live}-q1": True,  # True: must stay
        f"minipar-{live}-d4e5f6-files-2y": True,
        f"minipar-launch-{dead}x": True,  # not a job's: no owner in the name
        f"other-{dead}-files": True,
    }
    for name in made:
        (tmp_path / name).mkdir()
        (tmp_path / name / "fifo.0").write_text("")
    leftovers.sweep()
    kept = set(os.listdir(tmp_path))
    assert kept == {name for name, stays in made.items() if stays}, kept
    owned_by_dead = re.compile(rf"^minipar-(io-)?{dead}-")  # this test's own pattern
    assert not [n for n in kept if owned_by_dead.match(n)]


# -- a cable's rate, both ways -------------------------------------------------------------------
RATE = 100e6  # bits per second: "100mbit"
FLOW = 2_000_000  # bytes per flow: 0.16 s alone at 12.5 MB/s

RECEIVE = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(4); print("listening", flush=True)
conns = [s.accept()[0] for _ in range(int(sys.argv[2]))]
first = last = None; total = 0
import selectors
sel = selectors.DefaultSelector()
for c in conns: sel.register(c, selectors.EVENT_READ)
while sel.get_map():
    for key, _ in sel.select():
        data = key.fileobj.recv(1 << 20)
        if not data:
            sel.unregister(key.fileobj); continue
        now = time.time(); first = first or now; last = now; total += len(data)
print(first, last, total, flush=True)
"""
SEND = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(b"x" * int(sys.argv[3])); s.close()
"""


def _in_node(cluster, k: int, script: str, *args) -> subprocess.Popen:
    cmd = ["ip", "netns", "exec", cluster.namespace(k), sys.executable, "-c", script, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def _receive(cluster, node: int, senders: list[int], port: int) -> tuple[float, float, int]:
    """Node `node` receives FLOW bytes from each sender (on one connection each, at once);
    (first byte, last byte, bytes) as the receiver's clock saw them."""
    server = _in_node(cluster, node, RECEIVE, str(port), str(len(senders)))
    assert server.stdout.readline().strip() == "listening"
    clients = [
        _in_node(cluster, s, SEND, cluster.address(node), str(port), str(FLOW)) for s in senders
    ]
    for client in clients:
        assert client.wait(timeout=30) == 0
    out, _ = server.communicate(timeout=30)
    first, last, total = out.split()
    return float(first), float(last), int(total)


@emulation
def test_a_cable_is_shaped_out_of_the_node_and_into_it():
    """At 100 Mbit/s (12.5 MB/s each way): two nodes sending to a third at once share its cable
    in (not 25 MB/s: the switch shapes its port to the node), one node sending to two at once
    shares its cable out (its eth0 shapes it); either way 2 x FLOW bytes take at least 2 x FLOW
    / 12.5 MB/s (a slow machine only makes it longer), and less than 4x that (a rate read in
    bytes would be 8x slower)."""
    least = 0.85 * 2 * FLOW * 8 / RATE
    with EmulatedCluster(3, "100mbit") as cluster:
        first, last, total = _receive(cluster, 0, [1, 2], 5001)  # into node 0
        assert total == 2 * FLOW
        assert least <= last - first <= 4 * least, f"into a node: {last - first:.3f} s"
        results = []  # out of node 0, to nodes 1 and 2 at once
        threads = [
            threading.Thread(target=lambda k=k: results.append(_receive(cluster, k, [0], 5002)))
            for k in (1, 2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(r[2] for r in results) == [FLOW, FLOW]
        took = max(r[1] for r in results) - min(r[0] for r in results)
        assert least <= took <= 4 * least, f"out of a node: {took:.3f} s"


# -- ranks on 3 nodes of 2, 2 of 3, 3 + 2 --------------------------------------------------------
def _where():
    import socket

    import numpy as np

    import minipar
    from minipar import cost
    from minipar.collectives import hierarchical
    from minipar.runtime.devices import local_rank_from_env

    x = np.ones(1 << 20, np.float32)  # 4 MiB
    cost.set_inter_link(cost.Link("slow", 50e-6, 1 / 0.25e9, 1 / 5e9))  # 2 Gbit/s
    with minipar.trace() as t:
        minipar.all_reduce(x, algorithm="auto")
    said = local_rank_from_env(os.environ)
    return (
        minipar.get_rank(),
        socket.gethostname(),
        minipar.node_rank(),
        minipar.local_rank(),
        minipar.local_world_size(),
        said and said[0],
        hierarchical.shape(minipar.runtime.world.default_group()),
        t.calls[-1].algorithm,
        float(x[0]),
    )


# rank -> node, written out: consecutive ranks fill the nodes in blocks, the first ones larger
PLACES = {(6, 3): [0, 0, 1, 1, 2, 2], (6, 2): [0, 0, 0, 1, 1, 1], (5, 2): [0, 0, 0, 1, 1]}


def _check_places(n: int, nodes: int):
    """minipar.launch from this process (as from a notebook) on emulated nodes: every rank's
    place against PLACES, and the nodes gone once it returns."""
    import minipar

    got = minipar.launch(_where, n=n, nodes=nodes, timeout=120)
    assert [m for m in namespaces() if m.startswith(f"minipar-{os.getpid()}-")] == []
    node_of = PLACES[(n, nodes)]
    sizes = [node_of.count(k) for k in range(nodes)]
    even = len(set(sizes)) == 1
    for rank, row in enumerate(got):
        node = node_of[rank]
        local = node_of[:rank].count(node)
        shape = (nodes, sizes[0]) if even else None
        assert row[:7] == (rank, f"node{node}", node, local, sizes[node], local, shape), row
        assert row[7] == "hierarchical" if even else row[7] != "hierarchical", row
        assert row[8] == n, row


@emulation
def test_ranks_on_three_nodes_of_two():
    _check_places(6, 3)


@emulation
@pytest.mark.skipif(not EXTENDED, reason="MINIPAR_EXTENDED=1 (CI's cluster step)")
@pytest.mark.parametrize("n,nodes", [(6, 2), (5, 2)])
def test_ranks_on_two_nodes_of_three_and_unequal(n, nodes):
    _check_places(n, nodes)
