"""Before any activation moves: every rank agrees on the step and learns every stage's shapes.

Two control-plane steps, both small pickled all-gathers on the pipeline group:
1. agree: each rank states its schedule, micro-batch count and what it was given (the first
   stage: inputs, the last: targets and loss_fn); every rank checks everyone's statement the same
   way, so a bad layout raises the same clear error on every rank before any byte moves.
2. shapes (once per input shape, then cached): stage by stage, its owner runs a zero micro-batch
   through its chunk (no grad, eval mode) and announces the output shape and dtype, or the error
   its layers raised. The receiving side of every activation and gradient then knows its buffer
   exactly, and a stage that cannot take what the previous stage makes fails on every rank.
"""

from __future__ import annotations


def describe_tensor(x):
    """(shape, dtype name) of a tensor, or None for anything else."""
    import torch

    if not isinstance(x, torch.Tensor):
        return None
    return tuple(x.shape), str(x.dtype).removeprefix("torch.")


def agree(pipe, inputs, targets) -> tuple:
    """All-gather each rank's view of the step and raise one clear error on every rank."""
    mine = {
        "schedule": pipe.schedule,
        "m": pipe.n_microbatches,
        "v": pipe.virtual_stages,
        "inputs": describe_tensor(inputs) if pipe.rank == 0 else None,
        "targets": describe_tensor(targets) if pipe.rank == pipe.p - 1 else None,
        "loss_fn": pipe.loss_fn is not None,
    }
    seen = pipe.comm.allgather_object(mine, "pipeline step: agreeing on the layout")
    first, last = seen[0], seen[-1]
    for r, other in enumerate(seen):
        for key in ("schedule", "m", "v"):
            if other[key] != first[key]:
                raise ValueError(
                    f"pipeline ranks disagree on {key}: rank 0 has {first[key]!r}, "
                    f"rank {r} has {other[key]!r}"
                )
    m = first["m"]
    given = (("inputs", 0, first["inputs"]), ("targets", pipe.p - 1, last["targets"]))
    for who, rank, what in given:
        if what is None:
            raise ValueError(f"the pipeline's rank {rank} needs a tensor of {who}, got none")
        shape = what[0]
        if not shape or shape[0] % m:
            raise ValueError(
                f"n_microbatches={m} does not divide the batch of {who} of shape {shape} on "
                f"pipeline rank {rank}"
            )
    if not last["loss_fn"]:
        raise ValueError(f"the last pipeline stage (rank {pipe.p - 1}) needs a loss_fn")
    return first["inputs"], last["targets"]


def stage_shapes(pipe, inputs_spec, targets, chunks) -> list:
    """Input spec (shape, dtype) of every global stage, plus the last stage's output, in order."""
    import torch

    m, n_stages = pipe.n_microbatches, pipe.p * pipe.virtual_stages
    shape, dtype = inputs_spec
    specs = [((shape[0] // m, *shape[1:]), dtype)]
    for stage in range(n_stages):
        owner, chunk = stage % pipe.p, stage // pipe.p
        result = None
        if pipe.rank == owner:
            result = _probe(chunks[chunk], specs[-1], torch, pipe.device)
            if result[0] and stage == n_stages - 1:
                result = _probe_loss(pipe, result, targets, torch)
        ok, out = pipe.comm.allgather_object(result, "pipeline step: learning stage shapes")[owner]
        if not ok:
            raise ValueError(
                f"pipeline stage {stage} (rank {owner}, chunk {chunk}) cannot take an input of "
                f"shape {specs[-1][0]} {specs[-1][1]}"
                + (f" from stage {stage - 1}" if stage else "")
                + f": {out}"
            )
        specs.append(out)
    return specs


def _probe(module, spec, torch, device):
    shape, dtype = spec
    modes = [(mod, mod.training) for mod in module.modules()]
    module.eval()  # no running statistics updated, no dropout drawn
    try:
        with torch.no_grad():
            out = module(torch.zeros(shape, dtype=getattr(torch, dtype), device=device))
    except Exception as error:  # noqa: BLE001  (any layer's complaint, reported on every rank)
        return False, f"{type(error).__name__}: {error}"
    finally:
        for mod, training in modes:
            mod.training = training
    if not isinstance(out, torch.Tensor):
        return False, f"a stage must return one tensor, got {type(out).__qualname__}"
    return True, describe_tensor(out)


def _probe_loss(pipe, result, targets, torch):
    shape, dtype = result[1]
    target = targets[: targets.shape[0] // pipe.n_microbatches]
    try:
        with torch.no_grad():
            zeros = torch.zeros(shape, dtype=getattr(torch, dtype), device=pipe.device)
            loss = pipe.loss_fn(zeros, target)
    except Exception as error:  # noqa: BLE001
        return False, f"loss_fn rejects output {shape} with targets {tuple(target.shape)}: {error}"
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        return False, "loss_fn must return a single-element tensor"
    return result
