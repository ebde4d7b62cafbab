"""Sharded checkpoints (minipar/models/checkpoint_*.py): resharded between every layout of the 3D
checks (hybrid sharding's too: each shard written once), resumed bitwise on the same layout and
within the dense bounds on another, corrupt and
partial ones passed over with the reason (tests/ranks/checkpoint.py: the telling cases on 4
ranks; MINIPAR_EXTENDED=1 adds every layout of the 3D checks on 8); the pieces' arithmetic on
one process."""

import os

import pytest
import torch
from conftest import ranks_suite

from minipar.models import checkpoint_pieces
from minipar.parallel.tensor import plan
from minipar.testing import harness

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
