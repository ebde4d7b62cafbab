# Generated from solutions/ex07_send_recv.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 07`.
# The grader admits these imports here (others it refuses, naming the line):
#   torch, minipar.parallel.pipeline.schedules
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 07, the pipeline interpreter's send and receive step (lesson 07).

The interpreter (minipar/parallel/pipeline/interpreter/pipeline.py) runs a rank's instructions
one by one. Write what it does for the four message instructions, on minipar's point-to-point
transport (`comm.isend(buf, dst, tag)` returns a request; `comm.recv(buf, src, tag)` blocks):

    SendActivation(mb, chunk): the chunk's output goes to the NEXT stage      (kind 0)
    RecvActivation(mb, chunk): the chunk's input comes from the PREVIOUS stage (kind 0)
    SendGrad(mb, chunk):       the gradient of the chunk's input goes to the PREVIOUS stage (kind 1)
    RecvGrad(mb, chunk):       the gradient of the chunk's output comes from the NEXT stage (kind 1)

Stages: with p ranks, chunk c of rank r is global stage s = c * p + r, and stage s lives on rank
s % p. Tag: ((mb * n_stages + receiving_stage) * 2 + kind) % 2**15, where receiving_stage is the
stage the message goes to; both sides compute the same tag, so messages never mix.

The grader runs minipar's 1F1B and interleaved schedules on 2 to 4 ranks with your step for
every message, and compares each message's peer and tag with the worked solution's before it
moves: a failure names the rank, the instruction (its index in the rank's list, from 0), its
stage, and the peer and tag, yours beside the reference's; then every value received.

Grade it: minipar grade 07
"""

TAG_SPAN = 1 << 15


def message_step(comm, ins, n_stages: int, tensor=None, shape=None, dtype=None):
    """Run one message instruction on `comm` (the pipeline's group).

    Sends: `tensor` goes out with comm.isend; return the request (the caller waits for it at the
    end of the step, and keeps `tensor` alive until then). Receives: allocate
    torch.empty(shape, dtype=dtype), receive into it with comm.recv, return it.
    """
    import torch

    from minipar.parallel.pipeline import schedules as S

    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
