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

    # BEGIN SOLUTION hint: stage = ins.chunk * comm.size + comm.rank; peer stage +-1; rank % size
    stage = ins.chunk * comm.size + comm.rank
    toward_next = isinstance(ins, (S.SendActivation, S.RecvGrad))
    other = stage + 1 if toward_next else stage - 1
    kind = 0 if isinstance(ins, (S.SendActivation, S.RecvActivation)) else 1
    sending = isinstance(ins, (S.SendActivation, S.SendGrad))
    receiving_stage = other if sending else stage
    tag = ((ins.mb * n_stages + receiving_stage) * 2 + kind) % TAG_SPAN
    if sending:
        return comm.isend(tensor.detach().contiguous(), other % comm.size, tag)
    buf = torch.empty(shape, dtype=dtype)
    comm.recv(buf, other % comm.size, tag)
    return buf
    # END SOLUTION
