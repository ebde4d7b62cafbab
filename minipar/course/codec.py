"""Values across the grader's wall, as JSON: what a student's function takes and returns.

The grader never unpickles what a student's process sends (a pickle runs code as it loads), so
arguments and results cross as plain JSON with a few tagged kinds: numpy arrays and torch
tensors (dtype, shape, the bytes in base64), tuples, floats that JSON lacks (nan, inf), a
generator as the list it yields, and the pipeline's instructions (Forward(mb), ...) by name.
Anything else is refused by name, on the side that meets it.
"""

from __future__ import annotations

import base64
import dataclasses
import math
import types

import numpy as np


class CodecError(TypeError):
    """A value the grader cannot carry across (its type is named)."""


def _float(x: float):
    return x if math.isfinite(x) else {"float": repr(x)}


def _array(a: np.ndarray) -> dict:
    a = a if a.flags.c_contiguous else a.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": base64.b64encode(a).decode()}


def encode(value):
    """A JSON-able tree for `value` (raises CodecError naming a type it cannot carry)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, (list, types.GeneratorType)):
        return {"list": [encode(v) for v in value]}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: encode(v) for k, v in value.items()}}
    if isinstance(value, np.ndarray):
        return {"ndarray": _array(value)}
    if isinstance(value, np.generic):
        return {"scalar": _array(np.asarray(value))}
    if type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        return {"tensor": _tensor(value)}
    if dataclasses.is_dataclass(value) and type(value).__module__ == INSTRUCTIONS:
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"instruction": type(value).__name__, "fields": fields}
    raise CodecError(f"a {type(value).__name__}, which the grader cannot read")


INSTRUCTIONS = "minipar.parallel.pipeline.schedules"


def _tensor(t) -> dict:
    import torch

    t = t.detach().cpu().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    as_bits = t.view(torch.int16) if t.dtype in (torch.bfloat16,) else t
    return {"torch": name, **_array(as_bits.numpy())}


def _from_array(d: dict) -> np.ndarray:
    raw = base64.b64decode(d["data"])
    return np.frombuffer(raw, dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


def decode(tree):
    """The value `encode` made: only the kinds above, never code."""
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    if not isinstance(tree, dict) or len(tree) not in (1, 2):
        raise CodecError(f"not a value the grader wrote: {str(tree)[:80]}")
    if "float" in tree:
        return float(tree["float"])
    if "list" in tree:
        return [decode(v) for v in tree["list"]]
    if "tuple" in tree:
        return tuple(decode(v) for v in tree["tuple"])
    if "dict" in tree:
        return {str(k): decode(v) for k, v in tree["dict"].items()}
    if "ndarray" in tree:
        return _from_array(tree["ndarray"])
    if "scalar" in tree:
        return _from_array(tree["scalar"])[()]
    if "tensor" in tree:
        return _to_tensor(tree["tensor"])
    if "instruction" in tree:
        return _instruction(tree["instruction"], tree["fields"])
    raise CodecError(f"not a value the grader wrote: {str(tree)[:80]}")


def _to_tensor(d: dict):
    import torch

    dtype = getattr(torch, d["torch"], None)
    if not isinstance(dtype, torch.dtype):
        raise CodecError(f"no torch dtype {d['torch']!r}")
    t = torch.from_numpy(_from_array(d))
    return t.view(dtype) if dtype == torch.bfloat16 else t.to(dtype)


def _instruction(name: str, fields: dict):
    import importlib

    module = importlib.import_module(INSTRUCTIONS)
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise CodecError(f"no pipeline instruction {name!r}")
    return cls(**{k: decode(v) for k, v in fields.items()})
