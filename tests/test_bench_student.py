"""`minipar bench` as a student meets it: the default plan is small, its words are minipar's
(no internal ones), a name --algorithms does not know is refused, and `--impl DIR` times a
student's passing exercise beside the library's and MPI's (a wrong one is skipped, not timed)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, warm_python

from minipar.bench import spec
from minipar.cli import bench
from minipar.collectives import registry
from minipar.collectives.fast import routing


def _args(argv):
    parser = argparse.ArgumentParser()
    bench.configure(parser)
    return parser.parse_args(argv)


def test_the_default_bench_is_a_small_representative_plan():
    """No arguments: the all-reduce at a few sizes from latency to bandwidth, every algorithm,
    MPI, gloo, and the python floor only where it runs (up to 64 KiB): the rows counted here
    from the registry, not timed. The old default was 24 sizes and about 350 rows (175 s)."""
    job = bench.job_spec(_args([]))
    assert job["collectives"] == ["all_reduce"]
    sizes = job["sizes"]
    assert len(sizes) <= 4 and min(sizes) <= 8 and max(sizes) >= 1 << 20, sizes
    algorithms = len(registry.algorithms("all_reduce")) + len(routing.bench_variants("all_reduce"))
    algorithms += 1  # ring+window: a buffer in the shared window
    floors = sum(size <= 64 << 10 for size in sizes)  # the floor's own limit (ops.FLOOR_BYTES)
    want = len(sizes) * (algorithms + 2) + floors  # + MPI and gloo at every size
    assert bench.cell_count(job, 2) == want <= 60
    assert bench.cell_count(bench.job_spec(_args(["--sizes", "8B:64MiB"])), 2) > 300


@pytest.mark.parametrize(
    "algorithms,says",
    [
        ("student_ring,ring", "--algorithms student_ring: yours are timed with --impl DIR"),
        ("ring,rign", "--algorithms rign: all_reduce has no such algorithm; valid: auto,"),
    ],
)
def test_an_unknown_algorithm_is_named_never_dropped(algorithms, says, capsys):
    """It was dropped silently beside a known one (`student_ring,ring` timed the ring alone):
    exit 2, the name and the valid ones (or --impl, for a student's), before any rank runs."""
    assert bench.main(_args(["--algorithms", algorithms, "--sizes", "8", "--against", "none"])) == 2
    said = capsys.readouterr()
    first = (said.out + said.err).strip().splitlines()[0]
    assert says in first and len(first) <= 300, first
    assert "ring" in first


def test_impl_names_what_its_folder_lacks(tmp_path, capsys):
    shutil.copy(Path(ROOT) / "solutions" / "ex03_recursive_doubling.py", tmp_path)
    assert bench.main(_args(["--impl", str(tmp_path), "--algorithms", "student_ring"])) == 2
    said = capsys.readouterr().out
    assert "student_ring: not in --impl's folder (there: student_recursive_doubling)" in said


@pytest.mark.own_job
@pytest.mark.timeout(150)
def test_impl_times_a_students_passing_algorithm_and_skips_a_wrong_one(tmp_path):
    """A folder holding a right recursive doubling and a ring that never adds what it
    receives: the first is timed beside minipar's ring and MPI at both sizes, the second
    is skipped with why. The output has no internal words (an issue's number) and no
    ValueError lines (the python floor is not planned at 1 MiB, where it cannot run)."""
    folder = tmp_path / "mine"
    folder.mkdir()
    solutions = Path(ROOT) / "solutions"
    shutil.copy(solutions / "ex03_recursive_doubling.py", folder)
    ring = (solutions / "ex03_ring_allreduce.py").read_text()
    assert "        reduce_(mine, incoming, op)\n" in ring
    (folder / "ex03_ring_allreduce.py").write_text(
        ring.replace("        reduce_(mine, incoming, op)\n", "        pass\n")
    )
    out = tmp_path / "rows.json"
    argv = [*warm_python(["-m", "minipar"]), "bench", "--impl", str(folder), "--algorithms",
            "student_ring,student_recursive_doubling,ring", "--sizes", "8,1MiB",
            "--against", "mpi", "--iters", "3", "--warmup", "1", "--json", str(out),
            "--timeout", "120"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=140, cwd=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    rows = json.loads(out.read_text())
    timed = {(r["algorithm"], r["nbytes"]) for r in rows if r["implementation"] == "minipar"}
    assert timed == {(a, n) for a in ("student_recursive_doubling", "ring") for n in (8, 1 << 20)}
    assert {(r["implementation"], r["nbytes"]) for r in rows} >= {("mpi", 8), ("mpi", 1 << 20)}
    assert all(r["time_s_median"] > 0 for r in rows)
    assert "student_ring gives wrong values on 2 ranks; minipar grade shows where" in said
    assert "issue" not in said.lower() and "ValueError" not in said, said[-3000:]
    assert ("floor", 8) in {(r["implementation"], r["nbytes"]) for r in rows}
    assert spec.format_size(1 << 20) not in {
        spec.format_size(r["nbytes"]) for r in rows if r["implementation"] == "floor"
    }
