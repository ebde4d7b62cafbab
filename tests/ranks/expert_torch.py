"""Expert parallelism over minipar's torch.distributed transport (gloo, under
torch.multiprocessing.spawn): every case of expert.py (the launch costs more than the cases)."""

from expert import cases  # noqa: F401  (the suite's entry point, re-exported)
