"""Recomputation, activation memory and the trace on real meshes of the tiny GPT (cases of the
gpt_mesh.py launch: tests/test_gpt_mesh.py runs them on its 8 ranks).

- recompute.LAYOUT: one step of the layout three times, recompute none, selective and full, from
  the same weights and batch: the loss and every gradient (after the data-parallel average and
  the tied head's sum) bitwise equal (the same kernels on the same numbers, parallel/
  recompute.py); the bytes each block kept per micro-batch equal minipar's formula
  (models/memory.py: within 10% asked, to the byte found); the pipeline's peak equals the
  micro-batches it held at once times one micro-batch's bytes, and 1F1B holds min(p - r, m) on
  pipeline rank r; full recomputation runs each block's two tensor-parallel all-reduces again
  in backward (the ledger: 6 per block instead of 4).
- trace.dp2_tp2_pp2: one traced step saved by t.save: valid trace-event JSON (comm/chrome_trace
  .validate: phases, fields, paired flows, none arriving before it left, nesting), one process
  per rank, and on every rank as many message events as its ledger holds messages.
"""

import json
import os
import tempfile

import torch

import minipar
from minipar.comm.trace import chrome_trace
from minipar.models import memory, training
from minipar.models.config import GPTConfig, RunSpec
from minipar.models.data import Batches, dp_slice, load_tokens
from minipar.parallel import DeviceMesh

TINY = GPTConfig(seq_len=16, hidden=32, n_layers=8, n_heads=8)
# the layouts' three runs: 4 layers (one block per stage at pp = 4, two chunks of one at pp = 2
# interleaved) cost half of TINY's 8, and a block is a block: the same bytes, the same calls
SHORT = GPTConfig(seq_len=16, hidden=32, n_layers=4, n_heads=8)
POLICIES = ("none", "selective", "full")


def one_step(spec, mesh):
    """forward_backward + sync_grads of batch 0: (local loss, grads, the MeshGPT, ledger)."""
    part = training.build_for_mesh(spec, mesh)
    x, y = Batches(load_tokens(), spec.batch_size, spec.model.seq_len, spec.seed).get(0)
    rows = dp_slice(spec.batch_size, mesh.dp_rank, mesh.dp)
    with minipar.trace() as t:
        local = part.forward_backward(x[rows], y[rows])
        part.sync_grads()
    grads = [None if q.grad is None else q.grad.clone() for q in part.parameters()]
    return local, grads, part, t


def tp_all_reduces(t, mesh) -> int:
    return sum(1 for c in t.calls if c.group == mesh.tp_group.name and c.collective == "all_reduce")


def recompute_case(dp, tp, pp, schedule="1f1b", fsdp=False, tied=False, group=None):
    def case():
        mesh = DeviceMesh(dp, tp, pp, group=group)
        m = min(4 if pp > 1 else 2, 8 // dp)  # micro-batches: batch 8 = dp x m x rows
        runs = {}
        for policy in POLICIES:
            model = GPTConfig(**{**SHORT.to_dict(), "tied_head": tied})
            spec = RunSpec(dp, tp, pp, m, schedule, fsdp, steps=1, model=model, recompute=policy)
            runs[policy] = one_step(spec, mesh)
        base_loss, base_grads, _, base_trace = runs["none"]
        micro = 8 // dp // m
        for policy, (loss, grads, part, t) in runs.items():
            where = f"dp{dp} tp{tp} pp{pp} {schedule} fsdp={fsdp} recompute={policy}"
            assert loss == base_loss, (where, loss, base_loss)
            assert len(grads) == len(base_grads)
            for a, b in zip(grads, base_grads):
                assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), where
            want = memory.layer_bytes(SHORT, micro, tp, policy)
            for name, got in memory.per_layer(part.memory, m).items():
                assert abs(got - want) <= 0.1 * want, (where, name, got, want)
                assert got == want, (where, name, got, want)  # and in fact to the byte
            pipe = part.pipe
            if pipe is not None and len(part.chunks) == 1:  # every unit keeps the same
                one = set(pipe.unit_bytes.values())
                assert len(one) == 1, (where, one)
                assert pipe.peak_activation_bytes == pipe.peak_in_flight * one.pop(), where
                if schedule == "1f1b":
                    assert pipe.peak_in_flight == min(pp - mesh.pp_rank, m), where
            if tp > 1:
                blocks = sum(len(c.blocks) for c in part.chunks)
                extra = 2 * blocks * m if policy == "full" else 0  # g, again, in backward
                assert tp_all_reduces(t, mesh) == tp_all_reduces(base_trace, mesh) + extra, where

    return case


def peak_case():
    """1F1B's peak on every pipeline rank is exactly the micro-batches in flight times one's
    bytes (each (micro-batch, chunk) keeps the same), with and without recomputation."""
    mesh = DeviceMesh(1, 1, minipar.init().size)
    for policy in POLICIES:
        spec = RunSpec(1, 1, mesh.pp, 8, "1f1b", steps=1, model=TINY, recompute=policy)
        _, _, part, _ = one_step(spec, mesh)
        pipe, where = part.pipe, (policy, mesh.pp_rank)
        one = set(pipe.unit_bytes.values())  # each micro-batch's bytes, at its forward's end
        assert len(one) == 1, (where, one)
        one = one.pop()
        assert pipe.peak_in_flight == min(mesh.pp - mesh.pp_rank, 8), where
        assert pipe.peak_activation_bytes == pipe.peak_in_flight * one, where
        if 0 < mesh.pp_rank < mesh.pp - 1:  # a stage of blocks only: its formula
            want = memory.layer_bytes(TINY, 1, 1, policy) * TINY.n_layers // mesh.pp
            assert abs(one - want) <= 0.1 * want, (where, one, want)


def trace_case():
    comm = minipar.init()
    mesh = DeviceMesh(2, 2, 2)
    spec = RunSpec(2, 2, 2, 2, "1f1b", steps=1, model=TINY, recompute="full")
    folder = tempfile.mkdtemp(prefix="minipar-trace-") if comm.rank == 0 else None
    path = os.path.join(comm.allgather_object(folder)[0], "x.json")
    with minipar.trace() as t:
        t.align()
        training.train_on_mesh(spec, mesh)
    t.save(path)
    counts = comm.allgather_object(len(t.messages))
    if comm.rank == 0:
        with open(path) as f:
            doc = json.load(f)
        os.remove(path)
        os.rmdir(os.path.dirname(path))
        problems = chrome_trace.validate(doc)
        assert not problems, problems[:5]
        events = doc["traceEvents"]
        assert {e["pid"] for e in events} == set(range(comm.size))
        for rank, count in enumerate(counts):
            mine = [e for e in events if e.get("cat") == "message" and e["pid"] == rank]
            assert len(mine) == count, (rank, len(mine), count)
        assert not [e for e in events if e["ph"] == "i"], "every message met its partner"
        names = {e["name"] for e in events if e["ph"] == "X"}
        assert {"Forward 0", "Backward 1", "all_reduce", "recompute blocks.0"} <= names, names
        assert any(e["ph"] == "C" for e in events), "the saved activations' counter track"


def cases(size):
    if size != 8:
        return {}
    table = {
        "recompute.dp2_tp2_pp2": recompute_case(2, 2, 2),
        "recompute.interleaved.dp2_tp2_pp2": recompute_case(2, 2, 2, "interleaved"),
        "recompute.fsdp.dp2_tp2_pp2": recompute_case(2, 2, 2, fsdp=True),
        "recompute.tied.dp1_tp2_pp4": recompute_case(1, 2, 4, tied=True),
        "recompute.zb-h1.dp4_pp2": recompute_case(4, 1, 2, "zb-h1"),
        "recompute.gpipe.dp2_pp4": recompute_case(2, 1, 4, "gpipe"),
        "recompute.peak.pp8": peak_case,
        "trace.dp2_tp2_pp2": trace_case,
    }
    if os.environ.get("MINIPAR_EXTENDED") == "1":  # the axes one at a time, at 8 ranks
        table["recompute.tp8"] = recompute_case(1, 8, 1)
        table["recompute.dp8"] = recompute_case(8, 1, 1)
    return table
