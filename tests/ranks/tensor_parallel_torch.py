"""The tensor-parallel twins over minipar's torch.distributed transport (gloo, under
torch.multiprocessing.spawn): a spread of the cases in tensor_parallel.py."""

from tensor_parallel import cases as all_cases

KEEP = ("column.bias.tp", "row.bias.sp", "mlp.bias.sp", "attention.nobias.tp", "block.bias.sp")
KEEP += ("embedding", "cross_entropy.mean", "ledger.tp", "ledger.sp", "bad_layouts")


def cases(size):
    return {name: fn for name, fn in all_cases(size).items() if name in KEEP}
