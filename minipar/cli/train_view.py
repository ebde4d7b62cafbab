"""What `minipar train` shows beside the loss: activation memory against the formulas, and the
timeline of every rank (--trace).

    minipar train --pp 2 --microbatches 4 --recompute selective   # the memory table at the end
    minipar train --dp 2 --pp 2 --microbatches 4 --steps 2 --trace out.json   # + out.png

Activations: each rank measures what autograd kept during the last step (models/memory.py,
parallel/activation_memory.py); the table sets per block and micro-batch the measured bytes
beside minipar's formula for its own model and the planner's terms (planning/planner.py), and
the peak of the first pipeline stage (the one holding most) beside the formula times the
micro-batches the schedule keeps in flight there, and the planner's prediction.
"""

from __future__ import annotations

import contextlib

import minipar
from minipar.comm.trace import trace_png
from minipar.planning import planner


def activation_report(spec, mesh, part, comm) -> dict:
    """Collective: every rank's measured activations of the last step; on every rank, the
    figures of the table (bytes)."""
    # here, not at the top of the file: torch loads only when used
    from minipar.models import memory
    from minipar.parallel.pipeline import schedules, verify

    per_layer = memory.per_layer(part.memory, spec.microbatches)
    pipe = part.pipe
    mine = {
        "pp_rank": mesh.pp_rank,
        "peak": part.memory.peak,
        "kept_peak": pipe.peak_activation_bytes if pipe is not None else part.memory.peak,
        "per_layer": sum(per_layer.values()) / max(len(per_layer), 1),
    }
    ranks = comm.allgather_object(mine)
    micro = spec.batch_size // spec.dp // spec.microbatches
    m, config, v = spec.model, spec.model, len(part.chunks)
    formula = memory.layer_bytes(config, micro, spec.tp, spec.recompute)
    in_flight = 1
    if spec.pp > 1:
        program = schedules.program(spec.schedule, spec.pp, spec.microbatches, v)
        in_flight = verify.verify(program).peak_in_flight[0]  # (micro-batch, chunk) units
    layers_per_unit = m.n_layers // (spec.pp * v)
    model = planner.ModelSpec(m.n_layers, m.hidden, m.n_heads, m.seq_len, spec.batch_size,
                              m.vocab_size, m.ffn_hidden, m.tied_head, dropout=False,
                              experts=m.n_experts, top_k=m.top_k)  # fmt: skip
    first = [r for r in ranks if r["pp_rank"] == 0]
    return {
        "dtype": spec.dtype,
        "per_layer": {
            "measured": max(r["per_layer"] for r in ranks),
            "formula": formula,
            "planner": planner.layer_activations(model, spec.tp, micro, spec.recompute, 4, spec.cp),
        },
        "first_stage_peak": {
            "measured": max(r["kept_peak"] for r in first),
            "formula": in_flight * layers_per_unit * formula,
            "planner": planner.activation_memory(
                model, spec.tp, spec.pp, micro, spec.microbatches, spec.recompute, "fp32", spec.cp
            ),
        },
        "rank_peaks": [r["peak"] for r in ranks],
        "in_flight": in_flight,
        "recompute": spec.recompute,
    }


def activation_table(report):
    """A rich Table of the report (rank 0 prints it)."""
    from rich.table import Table

    def kib(n):
        return f"{n / 1024:,.1f} KiB"

    caption = None
    if report.get("dtype", "fp32") != "fp32":  # autocast keeps the matmuls' values in 16 bits
        caption = (
            f"the formulas count fp32 values; under --dtype {report['dtype']} the matmuls' "
            "inputs and outputs are kept in 16 bits, so less is measured"
        )
    t = Table(title=f"activations kept for backward (recompute: {report['recompute']})",
              title_justify="left", caption=caption)  # fmt: skip
    for name in ("", "measured", "formula (models/memory.py)", "planner"):
        t.add_column(name, justify="right" if name else "left")
    layer, peak = report["per_layer"], report["first_stage_peak"]
    t.add_row("per block, per micro-batch", *(kib(layer[k]) for k in ("measured", "formula",
              "planner")))  # fmt: skip
    t.add_row(f"first stage, {report['in_flight']} in flight", kib(peak["measured"]),
              kib(peak["formula"]), kib(peak["planner"]))  # fmt: skip
    peaks = report["rank_peaks"]
    t.add_row("every rank's step peak (min-max)", f"{kib(min(peaks))} - {kib(max(peaks))}", "", "")
    return t


@contextlib.contextmanager
def traced(path: str | None, comm):
    """With a path: every rank traced inside the block, clocks' offsets measured at its start;
    at its end the merged trace written to `path` and drawn beside it (PNG). Collective."""
    if not path:
        yield None
        return
    with minipar.trace() as t:
        t.align()
        yield t
    written = t.save(path)
    if comm.rank == 0 and written:
        png = path.rsplit(".", 1)[0] + ".png"
        try:
            trace_png.save_png(written, png)
        except ImportError:
            png = "(no PNG: --trace's picture needs matplotlib, pip install minipar[plot])"
        print(f"trace written to {written} (open it in ui.perfetto.dev); timeline: {png}")
