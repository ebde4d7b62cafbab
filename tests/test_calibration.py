"""This machine's calibration (minipar/cost/calibration.py, `minipar calibrate`): the fit on
synthetic data (a negative intercept refused), the store in a temp location, what doctor and
`--show` print. The real measurement (two ranks, about half a minute) runs with
MINIPAR_EXTENDED=1."""

import json
import os
import subprocess
import sys
import time

import pytest

from minipar.cli import calibrate as cli
from minipar.cost import calibration

SIZES = [8, 4 << 10, 64 << 10, 1 << 20, 4 << 20]


def test_fit_recovers_a_physical_link():
    alpha, beta = 3e-6, 1 / 2.5e9  # the line the times are drawn from, here
    fit = calibration.fit_link([1] * len(SIZES), SIZES, [alpha + n * beta for n in SIZES])
    assert fit.physical and fit.why == ""
    assert fit.alpha == pytest.approx(alpha, rel=1e-6)
    assert fit.beta == pytest.approx(beta, rel=1e-6)


def test_fit_with_a_negative_intercept_is_refused():
    # large messages only, on a line whose intercept is lesson 04's "fitted here -66.1 us"
    sizes = [1 << 20, 4 << 20, 16 << 20]
    fit = calibration.fit_link([1] * 3, sizes, [-66.1e-6 + n / 1.02e9 for n in sizes])
    assert fit.alpha == pytest.approx(-66.1e-6, rel=1e-6)
    assert not fit.physical and "negative intercept" in fit.why
    record = {"links": {"mpi": calibration.link_record(fit)}, "gamma": 1e-10}
    assert calibration.calibrated_link(record, "mpi") is None  # reported, never used


def test_fit_refuses_too_few_points_and_a_flat_slope():
    assert not calibration.fit_link([1], [8], [1e-6]).physical
    flat = calibration.fit_link([1, 1, 1], [8, 1 << 20, 4 << 20], [3e-5, 2e-5, 1e-5])
    assert not flat.physical and "beta" in flat.why


def test_store_in_a_temp_cache_leaves_the_home_alone(tmp_path, monkeypatch):
    monkeypatch.delenv(calibration.PATH_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert calibration.path() == tmp_path / "minipar" / "calibration.json"
    assert calibration.load() is None
    fit = calibration.fit_link([1, 1], [8, 1 << 20], [2e-6 + n / 4e9 for n in (8, 1 << 20)])
    record = {"host": "h", "date": "d", "time": 0.0, "minipar": "0", "cores": 2, "ranks": 2,
              "load": {"before": 0.1, "during": 0.2}, "links": {"mpi": calibration.link_record(
                  fit)}, "step_s": 9e-6, "bare_message_s": 2e-6, "gamma": 1 / 8e9,
              "copy_Bps": 9e9, "matmul_flops": 5e10}  # fmt: skip
    where = calibration.save(record)
    assert json.loads(where.read_text())["links"]["mpi"]["physical"] is True
    link = calibration.calibrated_link(calibration.load(), "mpi")
    assert link.alpha == pytest.approx(2e-6) and 1 / link.beta == pytest.approx(4e9, rel=1e-6)
    assert "calibrated on h" in link.source
    shown = dict(cli.rows(record))
    assert "4 GB/s" in shown["link mpi"] and "9 GB/s" in shown["memory copy"]
    assert "days ago" in shown["measured"]  # time 0: long ago
    assert sorted(p.name for p in (tmp_path / "minipar").iterdir()) == ["calibration.json"]


@pytest.mark.skipif(not os.environ.get("MINIPAR_EXTENDED"), reason="MINIPAR_EXTENDED=1: 2 ranks")
def test_calibrate_measures_and_doctor_shows_it(tmp_path):
    out = tmp_path / "c.json"
    env = {**os.environ, calibration.PATH_ENV: str(out)}
    done = subprocess.run([sys.executable, "-m", "minipar", "calibrate", "--timeout", "150"],
                          env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(out.read_text())
    assert record["links"]["mpi"]["points"] == 5 and record["links"]["shm"]["points"] == 5
    assert record["copy_Bps"] > 1e8 and record["matmul_flops"] > 1e8 and record["gamma"] > 0
    assert record["cores"] >= 1 and "before" in record["load"]
    assert {k: record[k] for k in ("python_prefix", "minipar_path")} == calibration.provenance()
    assert "link mpi" in done.stdout and "memory copy" in done.stdout


def test_doctor_shows_the_calibration_its_age_and_a_busy_one(tmp_path, monkeypatch):
    from minipar.cli import doctor

    where = tmp_path / "c.json"
    monkeypatch.setenv(calibration.PATH_ENV, str(where))
    none = doctor.calibration_checks()
    assert (
        none[0].value == "none" and none[0].status == "warn" and "minipar calibrate" in none[0].note
    )
    record = {"host": "h", "date": "d", "minipar": "0", "cores": 2, "ranks": 2,
              "load": {"before": 0.2, "during": 0.4}, "links": {}, "gamma": 1e-10,
              "copy_Bps": 9e9, "matmul_flops": 5e10, **calibration.provenance()}  # fmt: skip
    calibration.save({**record, "time": time.time() - 7200})
    fresh = doctor.calibration_checks()
    assert fresh[0].status == "ok" and "2 hours ago" in fresh[0].value
    assert any(c.name.strip() == "memory copy" and c.value == "9 GB/s" for c in fresh)
    calibration.save({**record, "time": time.time(), "load": {"before": 3.5, "during": 0.1}})
    busy = doctor.calibration_checks()[0]
    assert busy.status == "warn" and "busy" in busy.note
    calibration.save({**record, "time": time.time() - 40 * 86400})
    assert "older than a month" in doctor.calibration_checks()[0].note


def test_doctor_says_whose_calibration_it_is(tmp_path, monkeypatch):
    """The file is one per user, shared by every checkout and virtual environment: in a fresh
    venv doctor showed a calibration that venv never made, as its own. Now it names where it
    came from (the environment, minipar's folder and version) and asks for one of its own."""
    from minipar.cli import doctor

    monkeypatch.setenv(calibration.PATH_ENV, str(tmp_path / "c.json"))
    record = {"host": "h", "date": "2026-01-02T03:04:05Z", "minipar": "0.7", "cores": 2,
              "ranks": 2, "load": {}, "links": {}, "gamma": 1e-10, "copy_Bps": 9e9,
              "matmul_flops": 5e10, "time": time.time() - 60}  # fmt: skip
    other = {"python_prefix": "/elsewhere/.venv", "minipar_path": "/elsewhere/minipar"}
    calibration.save({**record, **other})
    first = doctor.calibration_checks()[0]
    assert first.status == "warn" and "run `minipar calibrate`" in first.note, first
    assert "/elsewhere/.venv" in first.note and "minipar 0.7 at /elsewhere/minipar" in first.note
    assert "2026-01-02" in first.value
    calibration.save({**record, **calibration.provenance()})
    mine = doctor.calibration_checks()
    assert mine[0].status == "ok", mine[0]
    assert any(c.name.strip() == "made by" and sys.prefix in c.value for c in mine)
    calibration.save(record)  # an older minipar's: where unknown
    assert "did not record where" in doctor.calibration_checks()[0].note
