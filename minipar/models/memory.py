"""The tiny GPT's activation memory: minipar's formula for its own model, and what a step kept.

    layer_bytes(config, micro=2, tp=2, recompute="selective")   # one block, one micro-batch
    with measure(part) as mem:           # around one step of a MeshGPT (mesh_model.py)
        part.forward_backward(x, y)
    mem.peak, per_layer(mem, microbatches)

What autograd keeps for backward, per block and micro-batch of b sequences of s tokens (hidden
h, a heads, ffn f = 4h, tensor parallel t, float32: 4 bytes a value), counted op by op in
gpt.Block and tensor/dense.causal_attention (measured: tests/test_recompute.py, to the byte):

    replicated on every tp rank    ln1's input, qkv's input, ln2's input, fc1's input   4 s b h
    split over the tp ranks        q, k, v (qkv's output) 3h, proj's input h,
                                   GELU's input f, fc2's input f                   (4h + 2f) s b / t
    the attention core             the softmax's output                               a s^2 b / t
    LayerNorm statistics           mean and 1/std of ln1 and ln2                          4 s b

so 16 s b h + 48 s b h / t + 4 a s^2 b / t + 16 s b bytes (f = 4h). That is Korthikanti et al.
2022's s b h (10 + 24/t + 5 a s / (h t)) for 16-bit values with dropout, without its dropout
(no masks: 10 -> 8, no dropout output: 5as/h -> 2as/h), in 4-byte values, plus the LayerNorm
statistics the paper leaves out (1/h of the rest, each). With recomputation:

    selective   the attention core keeps q, k, v (kept anyway) and drops the softmax: the
                formula without the a s^2 b / t term (the paper's 5as/h)
    full        the block keeps its input and nothing else: 4 s b h

The rest of a stage: the first keeps the token and position ids of the embedding (int64), the
last the final LayerNorm's input and statistics, the head's input and what the loss keeps
(measured, not in the formula). A pipeline rank holds a micro-batch's activations from its
forward to its backward: with 1F1B at most min(p - rank, m) at once, so its peak is that many
micro-batches' worth (tests/ranks/recompute.py checks both).
"""

from __future__ import annotations

import contextlib

from minipar.parallel import activation_memory

VALUE_BYTES = 4  # float32


def layer_bytes(config, micro: int, tp: int = 1, recompute: str = "none") -> int:
    """Bytes one block keeps for backward for one micro-batch of `micro` sequences (above)."""
    s, b, h, a, f = config.seq_len, micro, config.hidden, config.n_heads, config.ffn
    if recompute == "full":
        return VALUE_BYTES * s * b * h
    values = 4 * s * b * h + (4 * h + 2 * f) * s * b // tp + 4 * s * b
    if recompute == "none":
        values += a * s * s * b // tp
    return VALUE_BYTES * values


@contextlib.contextmanager
def measure(part):
    """An ActivationMemory (parallel/activation_memory.py) open around one step of `part`: its
    parameters excluded, the blocks' bytes by name (part.labelled), the live bytes on the
    trace's counter track."""
    with activation_memory.ActivationMemory(exclude=part.param_keys, track=True) as mem:
        yield mem


def per_layer(mem, microbatches: int) -> dict[str, float]:
    """{block name: bytes it kept per micro-batch} from a step's counter (blocks only)."""
    return {
        name: nbytes / microbatches
        for name, nbytes in mem.by_layer.items()
        if name.startswith("blocks.")
    }
