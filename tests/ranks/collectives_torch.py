"""The collectives matrix over minipar's torch.distributed transport (gloo, under
torch.multiprocessing.spawn): a spread of dtypes, the ledger, groups, async and memory cases."""

from collectives import cases as all_cases

KEEP = ("numpy_float32", "torch_bfloat16", "torch_int32", "large_4MiB")


def cases(size):
    return {
        name: fn
        for name, fn in all_cases(size).items()
        if name.endswith(KEEP) or "." not in name or name.startswith(("ledger.", "barrier."))
    }
