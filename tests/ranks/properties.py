"""Randomized collectives, run on every rank (see minipar.testing); tests/test_properties.py draws
the cases with hypothesis and writes them to the JSON file named by MINIPAR_PROPERTY_SPECS.

A spec is one call: world size, collective, algorithm, buffer kind (numpy or torch), dtype,
count, op, root, whether the values are exact, and a seed. Every rank rebuilds every rank's input
from (seed, rank), computes the reference with plain numpy (torch for torch-only rounding:
bfloat16 and AVG's division), runs the call, and checks:
- the result equals the reference: bit for bit when the values make every order of reduction
  exact (integers, which wrap; MIN/MAX; small integer-valued floats), else within the bound for
  summing p terms in any order;
- it is identical on every rank wherever every rank holds the same result;
- reduce leaves the non-root ranks' buffers as they were.
"""

import hashlib
import json
import os

import numpy as np

import minipar

SPECS_ENV = "MINIPAR_PROPERTY_SPECS"
EPS = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "complex64": 2.0**-24,
    "complex128": 2.0**-53,
}


def load_specs() -> list[dict]:
    path = os.environ.get(SPECS_ENV)
    if not path:
        return []
    with open(path) as f:
        return json.load(f)


def name(i: int, s: dict) -> str:
    op = f".{s['op']}" if s["op"] else ""
    root = f".root{s['root']}" if s["root"] is not None else ""
    exact = "" if s["exact"] else ".inexact"
    return (
        f"{i:04d}.{s['collective']}.{s['algorithm']}.{s['kind']}_{s['dtype']}.n{s['count']}"
        f"{op}{root}{exact}"
    )


# -- inputs and references (plain numpy, every rank computes all of them) -----------------------
def values(s: dict, rank: int, n: int) -> np.ndarray:
    """Rank `rank`'s n input values, as float64 / int64 / complex128 before the cast."""
    rng = np.random.default_rng([s["seed"], rank])
    dtype = s["dtype"]
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool)
    if dtype not in EPS:  # integers: the whole range, so SUM and PRODUCT wrap
        info = np.iinfo(np.dtype(dtype))
        return rng.integers(info.min, info.max, n, dtype=np.int64, endpoint=True)
    if s["exact"]:
        pick = [-2.0, -1.0, 1.0, 2.0] if s["op"] == "PRODUCT" else np.arange(-16.0, 17.0)
        v = rng.choice(pick, n)
        return v + 1j * rng.choice(pick, n) if dtype.startswith("complex") else v

    def draw():
        if s["op"] == "PRODUCT":  # magnitudes in [1/2, 2]: up to 8 factors stay in float16's
            return rng.uniform(0.5, 2.0, n) * rng.choice([-1.0, 1.0], n)  # normal range
        return rng.standard_normal(n)

    return draw() + 1j * draw() if dtype.startswith("complex") else draw()


def as_numpy(v, dtype: str) -> np.ndarray:
    """v in dtype (bfloat16 rounded by torch, then held as float32 for the arithmetic)."""
    if dtype == "bfloat16":
        import torch

        return to_numpy(torch.from_numpy(np.asarray(v, dtype=np.float64)).to(torch.bfloat16))
    return np.asarray(v).astype(dtype)


def make(s: dict, v):
    """The buffer a rank passes: numpy, or a torch tensor of the spec's dtype."""
    v = np.asarray(v)
    if s["kind"] == "numpy":
        return v.astype(s["dtype"])
    import torch

    return torch.from_numpy(v).to(getattr(torch, s["dtype"]))


def zeros(s: dict, n: int):
    return make(s, np.zeros(n))


def to_numpy(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    import torch

    return (x.float() if x.dtype == torch.bfloat16 else x).numpy()


def reduced(s: dict, parts: list[np.ndarray], p: int) -> np.ndarray:
    """The reference reduction of the ranks' parts (already in dtype) for the spec's op."""
    op, dtype = s["op"], s["dtype"]
    stack = np.stack(parts)
    if dtype == "bool":
        if op in ("SUM", "MAX"):
            return np.logical_or.reduce(stack, axis=0)
        return np.logical_and.reduce(stack, axis=0)
    ufunc = {"SUM": np.add, "AVG": np.add, "PRODUCT": np.multiply, "MIN": np.minimum}.get(
        op, np.maximum
    )
    wide = stack.dtype if dtype in EPS and dtype != "float16" else None
    out = ufunc.reduce(
        stack.astype(np.float64) if dtype == "float16" else stack, axis=0, dtype=wide
    )
    out = as_numpy(out, dtype)  # exact sums are exact in every dtype; inexact ones are compared
    if op == "AVG":
        out = divide(s, out, p)
    return out


def divide(s: dict, total: np.ndarray, p: int) -> np.ndarray:
    """AVG's last step, rounded the way the buffer's own library rounds it."""
    if s["kind"] == "torch":
        import torch

        t = torch.from_numpy(np.ascontiguousarray(total)).to(getattr(torch, s["dtype"]))
        return to_numpy(t.div_(p))
    out = total.astype(s["dtype"])
    np.divide(out, p, out=out, casting="unsafe")
    return out


def close(s: dict, got: np.ndarray, want: np.ndarray, parts, p: int) -> bool:
    """Exact when the values make it so, else |got - want| <= (p + 1) eps sum|x_i|."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False
    if s["exact"] or s["dtype"] not in EPS or s["op"] in ("MIN", "MAX", None):
        return np.array_equal(got, want)
    if s["op"] == "PRODUCT":
        return np.allclose(got, want, rtol=(p + 1) * 4 * EPS[s["dtype"]], atol=0)
    scale = np.sum(np.abs(np.stack(parts).astype(np.complex128)), axis=0)
    if s["op"] == "AVG":
        scale = scale / p
    bound = (p + 1) * EPS[s["dtype"]] * scale + np.finfo(np.float64).tiny
    return bool(np.all(np.abs(got.astype(np.complex128) - want.astype(np.complex128)) <= bound))


# -- one spec ----------------------------------------------------------------------------------
def run(s: dict) -> None:
    w = minipar.init()
    p, r, n = w.size, w.rank, s["count"]
    c, alg, root = s["collective"], s["algorithm"], s["root"]
    kw = {"algorithm": alg}
    block = [to_numpy(make(s, values(s, q, n))) for q in range(p)]  # one block per rank
    wide = [to_numpy(make(s, values(s, q, n * p))) for q in range(p)]  # p blocks per rank
    same_everywhere = None
    if c == "barrier":
        minipar.barrier(**kw)
        return
    if c in ("all_reduce", "reduce"):
        x = make(s, values(s, r, n))
        kw["op"] = s["op"]
        if c == "all_reduce":
            minipar.all_reduce(x, **kw)
            same_everywhere = x
        else:
            minipar.reduce(x, root, **kw)
        want = reduced(s, block, p) if c == "all_reduce" or r == root else block[r]
        got, parts = to_numpy(x), block
    elif c == "broadcast":
        x = make(s, values(s, r, n))
        minipar.broadcast(x, root, **kw)
        got, want, parts, same_everywhere = to_numpy(x), block[root], None, x
    elif c == "all_gather":
        out = zeros(s, n * p)
        minipar.all_gather_into_tensor(out, make(s, values(s, r, n)), **kw)
        got, want, parts, same_everywhere = to_numpy(out), np.concatenate(block), None, out
    elif c == "all_gather_list":
        outs = [zeros(s, n) for _ in range(p)]
        minipar.all_gather(outs, make(s, values(s, r, n)), **kw)
        got = np.concatenate([to_numpy(o) for o in outs])
        want, parts, same_everywhere = np.concatenate(block), None, got
    elif c == "reduce_scatter":
        out = zeros(s, n)
        minipar.reduce_scatter_tensor(out, make(s, values(s, r, n * p)), op=s["op"], **kw)
        parts = [part[r * n : (r + 1) * n] for part in wide]
        got, want = to_numpy(out), reduced(s, parts, p)
    elif c == "scatter":
        out = zeros(s, n)
        mine = values(s, r, n * p)
        chunks = [make(s, mine[q * n : (q + 1) * n]) for q in range(p)] if r == root else None
        minipar.scatter(out, chunks, root, **kw)
        got, want, parts = to_numpy(out), wide[root][r * n : (r + 1) * n], None
    elif c == "gather":
        outs = [zeros(s, n) for _ in range(p)] if r == root else None
        mine = make(s, values(s, r, n))
        minipar.gather(mine, outs, root, **kw)
        if r == root:
            got, want = np.concatenate([to_numpy(o) for o in outs]), np.concatenate(block)
        else:
            got, want = to_numpy(mine), block[r]
        parts = None
    else:  # all_to_all
        out = zeros(s, n * p)
        minipar.all_to_all_single(out, make(s, values(s, r, n * p)), **kw)
        got = to_numpy(out)
        want, parts = np.concatenate([wide[q][r * n : (r + 1) * n] for q in range(p)]), None
    assert close(s, got, want, parts, p), f"rank {r}: got {got[:8]}..., want {want[:8]}..."
    if same_everywhere is not None:
        digest = hashlib.sha256(to_numpy(same_everywhere).tobytes()).hexdigest()
        assert len(set(w.allgather_object(digest))) == 1, "ranks hold different results"


def specs_agree():
    """Every rank read the same specs (the file the pytest process wrote)."""
    w = minipar.init()
    with open(os.environ[SPECS_ENV], "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    assert len(set(w.allgather_object(digest))) == 1


def cases(size):
    table = {"specs_agree": specs_agree} if os.environ.get(SPECS_ENV) else {}
    for i, s in enumerate(load_specs()):
        if s["size"] == size:
            table[name(i, s)] = lambda s=s: run(s)
    return table
