"""Run under torchrun: minipar adopts torch.distributed (backend 'auto' sees RANK/WORLD_SIZE)."""

import torch

import minipar

w = minipar.init(timeout=20)
assert w.backend == "torch" and minipar.get_backend() == "gloo", minipar.get_backend()
for algorithm in minipar.algorithms("all_reduce"):
    x = torch.full((1000,), float(w.rank + 1))
    minipar.all_reduce(x, algorithm=algorithm)
    assert (x == w.size * (w.size + 1) / 2).all(), (algorithm, x[:3])
out = torch.empty(w.size * 3)
minipar.all_gather_into_tensor(out, torch.full((3,), float(w.rank)), algorithm="bruck")
assert out.tolist() == [float(r) for r in range(w.size) for _ in range(3)]
print(f"rank {w.rank} of {w.size}: ok")
