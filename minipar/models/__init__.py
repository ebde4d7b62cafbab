"""Models to train with minipar: a tiny GPT, its training text and its checkpoints.

    from minipar.models import GPTConfig, build_gpt, lm_loss
    from minipar.models.data import load_tokens, Batches
    from minipar.models import checkpoint

gpt.py is the dense model (the reference every parallel layout must match), data.py the shipped
text and byte tokenizer, checkpoint.py save/load of the dense weights.
"""

from minipar.models.gpt import GPT, Block, Embedding, GPTConfig, Head, build_gpt, lm_loss

__all__ = ["GPT", "GPTConfig", "Block", "Embedding", "Head", "build_gpt", "lm_loss"]
