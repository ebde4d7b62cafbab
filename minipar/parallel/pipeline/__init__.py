"""Pipeline parallelism: layers cut into stages on different ranks, micro-batches flowing through.

    from minipar.parallel.pipeline import Pipeline, split
    stage = split(model, n_stages=world_size)[rank]
    pipe = Pipeline(stage, n_microbatches=8, schedule="1f1b", loss_fn=F.mse_loss)
    loss = pipe.step(inputs, targets)       # the mean loss on the last stage, None elsewhere

One file per idea: split.py (stages from an nn.Sequential), schedules.py (GPipe, 1F1B,
interleaved, ZB-H1 as per-rank instruction lists), verify.py (run them all with no messages:
deadlocks, lost messages, predicted bubble), interpreter/pipeline.py (run one rank's list on
minipar's point-to-point transport), timeline.py (what each rank did when, drawn).
"""

from minipar.parallel.pipeline.interpreter.pipeline import Pipeline
from minipar.parallel.pipeline.split import split
from minipar.parallel.pipeline.timeline import Timeline

__all__ = ["Pipeline", "Timeline", "split"]
