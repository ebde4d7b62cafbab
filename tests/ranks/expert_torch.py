"""Expert parallelism over minipar's torch.distributed transport (gloo, under
torch.multiprocessing.spawn): a spread of the cases in expert.py."""

from expert import cases as all_cases

KEEP = ("twin.k1.capacity", "twin.k2.dropless", "twin.k2.uneven_tokens", "ledger.k2.capacity")
KEEP += ("local_tokens_stay", "bad_config", "bad_forward")


def cases(size):
    return {name: fn for name, fn in all_cases(size).items() if name in KEEP}
