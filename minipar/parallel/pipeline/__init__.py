"""Pipeline parallelism: layers cut into stages on different ranks, micro-batches flowing through.

    from minipar.parallel.pipeline import Pipeline, split
    stage = split(model, n_stages=world_size)[rank]
    pipe = Pipeline(stage, n_microbatches=8, schedule="1f1b", loss_fn=F.mse_loss)
    loss = pipe.step(inputs, targets)       # the mean loss on the last stage, None elsewhere

One file per idea: split.py (stages from an nn.Sequential), schedules.py (GPipe, 1F1B,
interleaved, ZB-H1 as per-rank instruction lists), verify.py (run them all with no messages:
deadlocks, lost messages, predicted bubble), interpreter/pipeline.py (run one rank's list on
minipar's point-to-point transport), timeline.py (what each rank did when, drawn).
Importing this package is light: torch loads on first use.
"""

from __future__ import annotations

from minipar import lazy

# split.py loads torch only when called; importing it here keeps the name `split` the function
# (importing the submodule later would otherwise rebind it to the module)
from minipar.parallel.pipeline.split import split  # noqa: F401  (public name)

_LAZY = {
    "Pipeline": "minipar.parallel.pipeline.interpreter.pipeline",
    "Timeline": "minipar.parallel.pipeline.timeline",
}

__all__ = sorted([*_LAZY, "split"])


__getattr__, __dir__ = lazy.attributes(__name__, _LAZY)
