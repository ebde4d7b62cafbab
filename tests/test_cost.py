"""The cost model's presets, predictions, hierarchy, link files and the roofline formula."""

from __future__ import annotations

import math

import pytest

from minipar import cost
from minipar.cost import roofline
from minipar.state import process

GiB = 1 << 30
GRADIENTS_7B_BF16 = 7e9 * 2  # bytes


@pytest.fixture(autouse=True)
def fresh_default(monkeypatch):
    """Each test starts with no default link chosen (and no MINIPAR_LINK)."""
    monkeypatch.delenv(cost.LINK_ENV, raising=False)
    monkeypatch.setattr(process, "links", {})


def test_presets_are_real_links_with_sources():
    for name in ("hbm3e", "nvlink5", "nvlink4", "pcie5", "ib_ndr"):
        link = cost.PRESETS[name]
        assert link.name == name and link.source
        assert 0 < link.alpha < 1e-4 and 0 < link.beta < 1e-9 and 0 < link.gamma < 1e-9
    # beta is one direction: NVLink 5's 1.8 TB/s is both ways together
    assert cost.NVLINK5.beta == pytest.approx(1 / 900e9)
    assert cost.NVLINK4.beta == pytest.approx(2 * cost.NVLINK5.beta)
    assert cost.IB_NDR.beta == pytest.approx(1 / 50e9)
    assert cost.HBM3E.beta < cost.NVLINK5.beta < cost.PCIE5.beta < cost.IB_NDR.beta


def test_ring_wins_large_messages_and_tree_small_ones():
    link, p = cost.NVLINK5, 8
    small, large = 8, GiB
    assert cost.predict("all_reduce", "tree", small, p, link) < cost.predict(
        "all_reduce", "ring", small, p, link
    )
    assert cost.predict("all_reduce", "ring", large, p, link) < cost.predict(
        "all_reduce", "tree", large, p, link
    )
    at = cost.crossover("all_reduce", "tree", "ring", p, link)
    assert small < at < large
    for n, ring_wins in ((at / 1.1, False), (at * 1.1, True)):
        ring = cost.predict("all_reduce", "ring", n, p, link)
        assert (ring < cost.predict("all_reduce", "tree", n, p, link)) == ring_wins


def test_crossover_is_none_when_one_algorithm_always_wins():
    # on 2 ranks the ring and the tree take the same 2 steps and send the same bytes, but the
    # ring reduces only half the buffer: it is never slower
    assert cost.crossover("all_reduce", "tree", "ring", 2, cost.SHARED_MEMORY) is None


def test_predict_is_the_alpha_beta_gamma_sum():
    link = cost.Link("test", alpha=1e-6, beta=1e-9, gamma=1e-10)
    n, p = 1 << 20, 4
    t = cost.traffic("all_reduce", "ring", n, p)
    assert (t.steps, t.bytes_sent, t.bytes_reduced) == (6, 1.5 * n, 0.75 * n)
    want = 6e-6 + 1.5 * n * 1e-9 + 0.75 * n * 1e-10
    assert cost.predict("all_reduce", "ring", n, p, link) == pytest.approx(want)


def test_hierarchical_all_reduce_of_7b_gradients():
    one_ring = cost.all_reduce_on_cluster(GRADIENTS_7B_BF16, 1, "ring")
    one_hier = cost.all_reduce_on_cluster(GRADIENTS_7B_BF16, 1, "hierarchical")
    eight_ring = cost.all_reduce_on_cluster(GRADIENTS_7B_BF16, 8, "ring")
    eight_hier = cost.all_reduce_on_cluster(GRADIENTS_7B_BF16, 8, "hierarchical")
    assert one_ring == pytest.approx(one_hier)  # one node: the same ring over NVLink
    # 2 (p-1)/p n over NVLink 5 is ~27 ms; the whole call stays within tens of milliseconds
    assert 0.02 < one_ring < 0.05
    # across nodes a flat ring pays InfiniBand for every byte; the hierarchy 1/8 of them
    assert eight_hier < one_ring + 2 * (7 / 8) * GRADIENTS_7B_BF16 / 8 / 50e9 * 1.1
    assert eight_hier * 4 < eight_ring
    assert eight_ring > 2 * 63 / 64 * GRADIENTS_7B_BF16 / 50e9  # IB-bound: > 0.55 s
    with pytest.raises(ValueError, match="hierarchical"):
        cost.all_reduce_on_cluster(1e9, 2, "tree")


def test_choose_is_cached_but_follows_the_default_link():
    names = ["ring", "recursive_doubling", "tree"]
    slow_steps = cost.Link("slow-steps", alpha=1.0, beta=1e-12, gamma=1e-12)
    slow_bytes = cost.Link("slow-bytes", alpha=1e-12, beta=1e-3, gamma=1e-3)
    cost.set_default_link(slow_steps)
    assert cost.choose("all_reduce", names, 1 << 20, 2) == "recursive_doubling"  # fewest steps
    cost.set_default_link(slow_bytes)
    assert cost.choose("all_reduce", names, 1 << 20, 2) == "ring"  # reduces half the bytes
    assert cost.choose("all_reduce", names, 1 << 20, 2, slow_steps) == "recursive_doubling"


def test_link_files_round_trip_and_minipar_link(tmp_path, monkeypatch):
    link = cost.Link("fitted:test", 9e-6, 2e-10, 1e-10, "a test")
    path = tmp_path / "sub" / "link.json"
    cost.save_link(link, str(path), alpha=9e-6, host="here")
    assert cost.load_link(str(path)) == link
    monkeypatch.setenv(cost.LINK_ENV, str(path))
    assert cost.default_link() == link
    (tmp_path / "bad.json").write_text('{"name": "x"}')
    with pytest.raises(ValueError, match="not a link file"):
        cost.load_link(str(tmp_path / "bad.json"))


def test_without_minipar_link_the_default_is_shared_memory():
    assert cost.default_link() is cost.SHARED_MEMORY


@pytest.mark.parametrize(
    "p,blocks",
    # worked by hand from recursive.py: the odd rank of the first folded pair sends its group's
    # blocks each step (2^k + min(2^k, rem) of them), then the whole result back
    [(2, 1), (3, 2 + 3), (4, 3), (5, 1 + 1 + 2 + 1 + 5), (6, 2 + 4 + 6), (8, 7)],
)
def test_all_gather_recursive_doubling_bytes(p, blocks):
    n = 256  # one rank's block
    assert cost.traffic("all_gather", "recursive_doubling", n * p, p).bytes_sent == blocks * n


@pytest.mark.parametrize("p,blocks", [(2, 1), (3, 1), (4, 2), (5, 2), (7, 3), (8, 4), (9, 4)])
def test_gather_tree_busiest_sender(p, blocks):
    # rank 2^k sends the min(2^k, p - 2^k) blocks of its subtree; the busiest is the largest
    assert cost.traffic("gather", "tree", 256 * p, p).bytes_sent == blocks * 256


def test_roofline_formula():
    copy, add = 8e9, 6e9
    n = 64 << 20
    floor = roofline.lower_bound("all_reduce", n, 2, copy, add)
    assert floor == pytest.approx(n / 2 / add + n / 2 / copy)
    assert roofline.lower_bound("all_reduce", n, 1, copy, add) == 0.0
    assert roofline.lower_bound("all_gather", n, 4, copy, add) == pytest.approx(n / copy)
    assert roofline.lower_bound("reduce_scatter", n, 4, copy, add) == pytest.approx(0.75 * n / add)
    for collective in ("broadcast", "reduce", "all_to_all", "scatter", "gather"):
        assert roofline.lower_bound(collective, n, 4, copy, add) > 0
    with pytest.raises(ValueError, match="no roofline"):
        roofline.lower_bound("barrier", n, 4, copy, add)


def test_roofline_grows_toward_two_reads_per_rank():
    # the floor of (p-1)/p n (1/add + 1/copy) tends to n (1/add + 1/copy) as p grows
    floors = [roofline.lower_bound("all_reduce", 1e9, p, 1e10, 1e10) for p in (2, 4, 64)]
    assert floors == sorted(floors)
    assert math.isclose(floors[-1], 0.2 * 63 / 64)


def test_local_copies_steer_auto_away_from_copying_algorithms():
    n = 64 << 20
    # on 2 ranks Bruck and the ring send the same bytes in one step; Bruck copies N + N/p more
    bruck, ring = (cost.traffic("all_gather", a, n, 2) for a in ("bruck", "ring"))
    assert (bruck.steps, bruck.bytes_sent) == (ring.steps, ring.bytes_sent)
    assert (bruck.bytes_copied, ring.bytes_copied) == (n + n / 2, n / 2)
    link = cost.SHARED_MEMORY
    assert cost.choose("all_gather", ["bruck", "ring"], n, 2, link) == "ring"
    assert cost.choose("reduce_scatter", ["recursive_halving", "ring"], n, 2, link) == "ring"
    assert cost.traffic("all_reduce", "ring", n, 8).bytes_copied == 0


SLOW = cost.Link("between", 50e-6, 1 / 0.25e9, 1 / 5e9)  # a 2 Gbit/s link between nodes


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("nodes,per_node", [(2, 2), (2, 4), (4, 2), (3, 3)])
def test_two_levels_send_the_rings_bytes_in_fewer_steps(collective, nodes, per_node):
    """Inside plus between, the two-level schemes send what the flat ring sends (each chunk
    once through a ring per level), in (k-1) + (N-1) steps per phase instead of p-1; between
    nodes a rank sends a k-th of an all-reduce's shard traffic, (N-1)/N S/k per phase."""
    S, p = 1 << 24, nodes * per_node
    inside, between = cost.traffic_on_nodes(collective, "hierarchical", S, nodes, per_node)
    flat = cost.traffic(collective, "ring", S, p)
    assert inside.bytes_sent + between.bytes_sent == pytest.approx(flat.bytes_sent)
    assert inside.steps + between.steps < flat.steps
    phases = 2 if collective == "all_reduce" else 1
    shard = S / per_node if collective != "all_gather" else S / p * nodes
    assert between.bytes_sent == pytest.approx(phases * (nodes - 1) / nodes * shard)
    assert cost.traffic(collective, "hierarchical", S, p) == flat  # on one node: the ring


def test_two_links_price_the_hierarchy():
    """On 2 x 2 with a slow link between nodes: the model's ratio flat ring / hierarchical is
    about the node link's bytes ratio, 2 (p-1)/p / (2 (N-1)/N) = 1.5, at 64 MiB; `auto`
    (choose_on_nodes) takes hierarchical there, a flat latency-bound scheme at 8 bytes, and
    with a NIC per rank (links_per_node = k) the hierarchy pays k times more."""
    fast, big = cost.SHARED_MEMORY, 64 << 20
    ring = cost.predict_on_nodes("all_reduce", "ring", big, 2, 2, fast, SLOW)
    two = cost.predict_on_nodes("all_reduce", "hierarchical", big, 2, 2, fast, SLOW)
    assert 1.3 < ring / two < 1.5
    nic_each = cost.predict_on_nodes("all_reduce", "hierarchical", big, 2, 2, fast, SLOW, 2)
    assert ring / nic_each > 2.5
    names = ["double_tree", "hierarchical", "rabenseifner", "recursive_doubling", "ring", "tree"]
    assert cost.choose_on_nodes("all_reduce", names, big, 2, 2, fast, SLOW) == "hierarchical"
    assert cost.choose_on_nodes("all_reduce", names, 8, 2, 2, fast, SLOW) != "hierarchical"
    tree = cost.predict_on_nodes("all_reduce", "tree", big, 2, 2, fast, SLOW)
    assert tree > ring  # the flat tree sends the whole buffer over the slow link log2 p times


def test_auto_gives_a_tie_to_the_ring():
    """On 2 ranks Rabenseifner sends the ring's messages: the model prices them alike, and auto
    takes the ring, whose fast forms (the pieces, the windows) are the ones minipar has."""
    from minipar.collectives import registry

    link = cost.default_link()
    n = 64 << 20
    ring = cost.predict("all_reduce", "ring", n, 2, link)
    assert cost.predict("all_reduce", "rabenseifner", n, 2, link) == pytest.approx(ring)
    assert registry.auto_choice("all_reduce", n, 2, None, (link, None)) == "ring"
