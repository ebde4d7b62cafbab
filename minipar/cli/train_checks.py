"""`minipar train`'s options checked before any rank starts (before torch loads, even for one
process): the run's RunSpec validated (models/config.py, plain data), its words said as the
flags the user typed, in one or two lines.

    problem(args, spec_from_args)   # None, or "--batch-size 8 is not divisible by --dp 3 ..."
"""

from __future__ import annotations

import os
import re

FLAGS = {  # RunSpec's and GPTConfig's names -> the option that sets them
    "batch_size": "--batch-size",
    "microbatches": "--microbatches",
    "n_heads": "--heads",
    "n_layers": "--layers",
    "seq_len": "--seq",
    "hidden": "--hidden",
    "n_experts": "--experts",
    "top_k": "--top-k",
    "cp_variant": "--cp-variant",
    "decay steps": "--decay-steps",
    "reduce dtype": "--reduce-dtype",
    "lr schedule": "--lr-schedule",
    "min lr": "--min-lr",
    "warmup": "--warmup",
    "steps": "--steps",
    "schedule": "--schedule",
    "recompute": "--recompute",
    "dtype": "--dtype",
    "clip": "--clip",
    "lr": "--lr",
    "dp_shard": "--dp-shard",
    **{axis: f"--{axis}" for axis in ("dp", "tp", "pp", "cp", "ep")},
}
_NAME = "|".join(sorted(map(re.escape, FLAGS), key=len, reverse=True))


def as_flags(message: str) -> str:
    """RunSpec's message with its names as flags: 'batch_size=8' -> '--batch-size 8', 'clip
    must' -> '--clip must', 'GPTConfig.n_heads must' -> '--heads must'."""
    message = re.sub(r"GPTConfig[.:]\s*", "", message)
    message = re.sub(rf"(?<![\w-])({_NAME})=(\S+)", lambda m: f"{FLAGS[m[1]]} {m[2]}", message)
    message = re.sub(rf"^({_NAME})( \S+)? (must|is)\b",
                     lambda m: f"{FLAGS[m[1]]}{m[2] or ''} {m[3]}", message)  # fmt: skip
    code = "|".join(n for n in FLAGS if "_" in n)  # bare code names: n_experts, top_k, ...
    return re.sub(rf"(?<![\w-])({code})\b", lambda m: FLAGS[m[1]], message)


def _positive(args) -> str | None:
    for dest in ("timeout", "lr"):
        value = getattr(args, dest, None)
        if value is not None and not value > 0:
            return f"--{dest} must be a positive number, got {value:g}"
    return None


def _paths(args) -> str | None:
    """A checkpoint to resume that is not there, an output whose folder is not (found at the end
    of the run, after the training, were it not checked here)."""
    resume = getattr(args, "resume", None)
    if resume and not os.path.isfile(resume):
        return f"--resume {resume}: no such file"
    for dest in ("json", "plot", "save", "trace"):
        path = getattr(args, dest, None)
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            return f"--{dest} {path}: no folder {folder} to write it in"
    return None


def hybrid(args) -> str | None:
    """--dp-shard K / --dp-replicate R (either, or both): dp = K x R and FSDP on, or what is
    wrong with them (before any rank starts)."""
    shard, replicate = getattr(args, "dp_shard", None), getattr(args, "dp_replicate", None)
    if shard is None and replicate is None:
        return None
    for flag, value in (("--dp-shard", shard), ("--dp-replicate", replicate)):
        if value is not None and value < 1:
            return f"{flag} must be a positive integer, got {value}"
    dp = args.dp or (shard or 1) * (replicate or 1)
    shard = shard or dp // replicate
    replicate = replicate or dp // shard
    if shard * replicate != dp:
        return (
            f"--dp {dp} is not --dp-shard {shard} x --dp-replicate {replicate}; give --dp "
            f"{shard * replicate} (or leave --dp out)"
        )
    args.dp, args.dp_shard, args.dp_replicate, args.fsdp = dp, shard, replicate, True
    return None


def problem(args, spec_from_args) -> str | None:
    """What is wrong with the options, said with their flags (None: nothing found);
    spec_from_args(args) makes the RunSpec (train.py's)."""
    said = _positive(args) or _paths(args)
    if said:
        return said
    if args.resume:  # the checkpoint's model is checked once it is read, on the ranks
        return None
    try:
        spec_from_args(args).validate()
    except ValueError as error:
        text = as_flags(str(error))
        per_step = args.dp * args.microbatches
        if args.batch_size % per_step == 0 or "--batch-size" not in text:
            return text
        fits = -(-args.batch_size // per_step) * per_step
        return f"{text}: each micro-batch takes whole sequences (--batch-size {fits} would do)"
    return None
