"""A case that needs a variable at launch (tests/test_harness.py): MINIPAR_STAGE_CHUNK is read
when the default group is made, so only a job started with it set sees it there."""

import os

import minipar


def chunk_from_launch():
    chunk = minipar.init()._chunk  # read by the MPI transport when it made the default group
    assert chunk == int(os.environ["MINIPAR_STAGE_CHUNK"]), chunk


def cases(size):
    return {"chunk_from_launch": chunk_from_launch}
