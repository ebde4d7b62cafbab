"""Sharded checkpoints (minipar/models/checkpoint_*.py): resharded between every layout of the 3D
checks (hybrid sharding's too: each shard written once), resumed bitwise on the same layout and
within the dense bounds on another, corrupt and
partial ones passed over with the reason (tests/ranks/checkpoint.py: the telling cases on 4
ranks; MINIPAR_EXTENDED=1 adds every layout of the 3D checks on 8); the pieces' arithmetic on
one process, and the files' rules (a dead job's newer folders cleared, pruning sparing a save in
flight, a manifest only from this save's records) on one process in a tmp folder.

Checks: minipar/models/checkpoint.py, checkpoint_files.py, checkpoint_loader.py,
checkpoint_pieces.py, checkpoint_saver.py. A rank's thread writing while its node dies (a torn
file on a real disk) needs a real cluster: tests/test_cluster.py's killed node stands in."""

import os

import pytest
import torch
from conftest import ranks_suite

from minipar.models import checkpoint_files, checkpoint_loader, checkpoint_pieces
from minipar.parallel.tensor import plan
from minipar.testing import harness

pytestmark = pytest.mark.slow  # CI's long checks only (MINIPAR_EXTENDED=1)

SUITE = ranks_suite("checkpoint.py")
SIZES = [4, 8] if os.environ.get("MINIPAR_EXTENDED") == "1" else [4]


@pytest.mark.parametrize("size,name", harness.params(SUITE, SIZES))
def test_checkpoints_on_meshes(size, name):
    harness.run_suite(SUITE, size, "mpi", timeout=600).check(name)


@pytest.mark.parametrize("cut", ["rows", "cols", "vocab", "qkv", None])
@pytest.mark.parametrize("old_p,new_p", [(2, 1), (1, 4), (2, 4), (4, 2), (3, 2), (2, 3)])
def test_a_piece_is_rebuilt_from_the_old_pieces_it_overlaps(cut, old_p, new_p):
    """plan.shard (the layers' own cut) of a dense tensor at old_p, rebuilt at new_p by
    assemble from the overlapping old pieces only: the new piece is plan.shard's at new_p."""
    shape = {"cols": (6, 12), "qkv": (36, 4), "vocab": (13, 4)}.get(cut, (12, 4))
    dense = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(shape) + 1
    if cut is None:
        old_p = 1
    metas, saved = [], {}
    for q in range(old_p):
        piece = plan.shard(dense, cut, q, old_p)
        meta = {"name": "w", "kind": "param", "cut": cut, "p": old_p, "q": q, "key": str(q)}
        meta.update(shape=list(piece.shape), lo=0, hi=piece.numel())
        metas.append(meta)
        saved[str(q)] = piece.reshape(-1)
    read = []
    for q in range(new_p):
        got = checkpoint_pieces.assemble(
            metas, shape, lambda m: read.append(m["q"]) or saved[m["key"]], new_p, q
        )
        assert torch.equal(plan.shard(got, cut, q, new_p), plan.shard(dense, cut, q, new_p))
    if cut is not None and old_p == new_p:
        assert read == list(range(new_p)), read  # each rank read its own piece only


# -- the files' rules on one process: what a dead job leaves, what pruning spares, whose records
# make a manifest (issue 72's planted bugs; no ranks, a tmp folder) --------------------------


def _whole(root, step, payload=b"weights"):
    """A checkpoint folder of step `step` with one shard file and a manifest listing it (size
    and sha256 computed here, with hashlib)."""
    import hashlib
    import json

    folder = checkpoint_files.step_dir(str(root), step)
    os.makedirs(folder)
    with open(os.path.join(folder, "shard-00000.pt"), "wb") as f:
        f.write(payload)
    listed = {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    manifest = {"format": "minipar-sharded/1", "step": step, "files": {"shard-00000.pt": listed}}
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return folder


def _partial(root, step):
    folder = checkpoint_files.step_dir(str(root), step)
    os.makedirs(folder)
    open(os.path.join(folder, "shard-00000.pt"), "wb").close()  # no manifest: never finished
    return folder


def test_the_loader_clears_what_a_dead_job_left_newer_than_its_checkpoint(tmp_path):
    """Steps 2 and 3 whole, 4 half-written, 5 with a flipped byte: both ranks (a simulated
    world of 2) resume at 3, rank 0 says why 5 and 4 were passed over, and removes them, so
    the run writes steps 4 and 5 afresh, never into a dead job's files."""
    from minipar.simulate.cluster import preset
    from minipar.simulate.runner import simulate
    from minipar.state import process

    _whole(tmp_path, 2)
    three = _whole(tmp_path, 3)
    _partial(tmp_path, 4)
    five = _whole(tmp_path, 5)
    with open(os.path.join(five, "shard-00000.pt"), "r+b") as f:
        f.write(b"W")
    lines = []

    def rank(r):
        folder, manifest = checkpoint_loader.choose(str(tmp_path), process.world, lines.append)
        return folder, manifest["step"]

    run = simulate(rank, 2, preset("h100"))
    assert run.results == [(three, 3), (three, 3)]
    assert checkpoint_files.steps(str(tmp_path)) == [2, 3]
    assert len(lines) == 2 and "step-00000005" in lines[0] and "sha256 differs" in lines[0]
    assert "step-00000004" in lines[1] and "no manifest.json" in lines[1]


def test_pruning_spares_a_newer_save_still_being_written(tmp_path):
    """keep 2 of whole steps 1, 2, 3: step 1 and the partial step 0 before it go; the partial
    step 4 (the next save, the other ranks' shards arriving while rank 0 prunes) stays."""
    _partial(tmp_path, 0)
    for step in (1, 2, 3):
        _whole(tmp_path, step)
    _partial(tmp_path, 4)
    removed = checkpoint_files.prune(str(tmp_path), 2)
    assert removed == [checkpoint_files.step_dir(str(tmp_path), s) for s in (0, 1)]
    assert checkpoint_files.steps(str(tmp_path)) == [2, 3, 4]


def test_a_manifest_waits_for_this_saves_records_not_a_dead_runs(tmp_path, monkeypatch):
    """Rank 0's manifest of a 2-rank save: rank 1's record in the folder is an earlier run's
    (another token), so no manifest is written; past the wait, an error names rank 1."""
    import json

    from minipar.models import checkpoint_saver

    folder = tmp_path / "step-00000007"
    folder.mkdir()
    for rank, token in ((0, "new-7"), (1, "old-7")):
        record = {"rank": rank, "token": token, "pieces": [], "bytes": 0, "sha256": ""}
        (folder / f"shard-{rank:05d}.json").write_text(json.dumps(record))
    monkeypatch.setattr(checkpoint_saver, "RECORD_WAIT", 0.2)
    saver = object.__new__(checkpoint_saver.ShardedSaver)
    saver.root, saver.keep, saver.log = str(tmp_path), 2, lambda text: None
    with pytest.raises(TimeoutError, match=r"ranks \[1\] wrote no shard"):
        saver._manifest(str(folder), {"step": 7, "token": "new-7", "world": 2})
    assert not (folder / "manifest.json").exists()
