"""The stored calibration prices this machine: the cost model's default link and `minipar
bench`'s in-node predicted_s read it when it is fresh, physical and this host's, and fall back to
the preset (and say so) otherwise. The calibrations here are synthetic files written by the test."""

import json
import time

import pytest

from minipar import cost
from minipar.bench import report
from minipar.cost import calibration
from minipar.state import process

ALPHA, BETA, STEP, GAMMA = 7e-6, 1 / 3e9, 11e-6, 1 / 4e9  # the calibration's numbers, here


def synthetic(**changes) -> dict:
    record = {
        "host": "node0",
        "date": "2026-12-01T10:00:00Z",
        "time": time.time() - 3600,
        "cores": calibration._cores(),
        "links": {"mpi": {"alpha": ALPHA, "beta": BETA, "physical": True, "why": ""}},
        "step_s": STEP,
        "gamma": GAMMA,
    }
    record.update(changes)
    return record


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """Store a calibration (a function of the record) where the cost model looks; the links kept
    in `process.links` start empty and are put back after."""
    where = tmp_path / "calibration.json"
    monkeypatch.setenv(calibration.PATH_ENV, str(where))
    monkeypatch.delenv(cost.LINK_ENV, raising=False)
    monkeypatch.setattr(process, "links", {})

    def store(record):
        where.write_text(json.dumps(record))
        process.links.clear()

    return store


def test_the_default_link_is_the_calibration(stored):
    stored(synthetic())
    link = cost.default_link()
    assert link.alpha == pytest.approx(ALPHA + STEP)  # a collective's step: message + Python
    assert link.beta == pytest.approx(BETA) and link.gamma == pytest.approx(GAMMA)
    assert "calibration of 2026-12-01T10:00:00Z on node0" in link.source


@pytest.mark.parametrize(
    "changes, why",
    [
        ({"time": time.time() - 8 * 86400}, "stale"),
        ({"links": {"mpi": {"alpha": -66e-6, "beta": BETA, "physical": False,
                            "why": "negative intercept"}}}, "negative intercept"),
        ({"cores": 999}, "999 cores"),
        ({"step_s": None}, "per-step cost"),
    ],
)  # fmt: skip
def test_a_stale_or_unphysical_calibration_is_not_used(stored, changes, why):
    stored(synthetic(**changes))
    assert why in calibration.unusable(calibration.load())
    assert cost.default_link() == cost.SHARED_MEMORY
    assert "preset" in cost.default_link().source


def test_another_hostname_still_uses_it(stored):
    # emulated nodes (node0, node1) share the machine and the file: every rank must price alike
    stored(synthetic(host="node1"))
    assert cost.default_link().alpha == pytest.approx(ALPHA + STEP)


def test_without_a_calibration_the_preset(stored):
    assert cost.default_link() == cost.SHARED_MEMORY  # nothing stored at the path


def test_bench_prices_in_node_rows_on_the_calibration(stored):
    stored(synthetic())
    p, n = 2, 1 << 20
    events = [
        {"type": "header", "world_size": p},
        {"type": "row", "collective": "all_reduce", "algorithm": "ring",
         "implementation": "minipar", "nbytes": n, "times": [1e-3, 2e-3, 3e-3]},
    ]  # fmt: skip
    (row,) = report.records(events, "float32", cost.default_link())
    # the ring: 2(p-1) steps, 2(p-1)/p N sent, (p-1)/p N reduced
    expected = 2 * (p - 1) * (ALPHA + STEP) + 2 * (p - 1) / p * n * BETA + (p - 1) / p * n * GAMMA
    assert row["predicted_s"] == pytest.approx(expected)
    assert "calibration of 2026-12-01" in row["priced_on"]


def test_plan_here_is_priced_on_the_calibration(stored, capsys):
    from minipar.cli import main as cli_main
    from minipar.planning.here import here_cluster

    stored(synthetic(matmul_flops=3e9, ranks=2, cores=calibration._cores()))
    cluster = here_cluster()
    assert cluster.hierarchy.intra.alpha == pytest.approx(ALPHA + STEP)
    assert cluster.hierarchy.inter.beta == pytest.approx(BETA)
    assert cluster.peak_flops == pytest.approx(3e9 * max(1.0, 2 / calibration._cores()))
    argv = ["plan", "--model", "tiny", "--cluster", "here", "--gpus", "2"]
    assert cli_main(argv) == 0
    assert "calibration of 2026-12-01T10:00:00Z" in " ".join(capsys.readouterr().out.split())
    assert cli_main([*argv[:-4], "--cluster", "dgx-h100"]) == 0
    assert "cluster dgx-h100: preset" in capsys.readouterr().out


def test_plan_here_refuses_without_a_calibration(stored, capsys):
    from minipar.cli import main as cli_main

    assert cli_main(["plan", "--model", "tiny", "--cluster", "here", "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert "--cluster here" in err and "minipar calibrate" in err
    stored(synthetic(time=time.time() - 30 * 86400))
    assert cli_main(["plan", "--model", "tiny", "--cluster", "here", "--gpus", "2"]) == 2
    assert "stale" in capsys.readouterr().err
