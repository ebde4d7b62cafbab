"""The context-parallel cases over minipar's torch.distributed transport (gloo, under
torch.multiprocessing.spawn): all of context.py's but the comparison with torch's own ring
kernels, which the MPI runs make with gloo brought up beside MPI (loading torch's DTensor costs
seconds on every rank)."""

from context import cases as all_cases


def cases(size):
    return {name: fn for name, fn in all_cases(size).items() if not name.startswith("vs_torch")}
