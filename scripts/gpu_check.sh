#!/usr/bin/env bash
# The GPU check, in one command, on a machine with one or more CUDA GPUs, Python and torch (numpy,
# rich, cloudpickle, pytest there too), no network and no MPI:
#
#   bash scripts/fetch_gpu_wheels.sh          # once, where pip works: fills .whl/ (gitignored)
#   bash scripts/gpu_check.sh [OUTDIR]        # on the GPU machine, from the repository root
#   bash scripts/gpu_check.sh --cpu-dry-run [OUTDIR]   # anywhere: the same driver, CPU tensors
#
# It installs the carried wheels (.whl/: the mpich wheel with libmpi and mpiexec, and mpi4py),
# then runs scripts/gpu_check.py: every collective x algorithm on CUDA tensors at 2 and 4 ranks
# (sharing the GPU where there is one) against the same collectives on the CPU, against
# torch.distributed (NCCL with a GPU per rank, else gloo) and against single-device math; the
# pipelined staged path with small chunks; DDP, FSDP, TP and PP steps on the GPU against the
# single-device model; the 2-rank all-reduce bench at 1 MiB and 64 MiB with the staging cost
# apart. Results: OUTDIR/results.json and OUTDIR/results.md (the table for docs/gpu-results.md).
# Exit status 0 only when every check passed. Takes under 5 minutes on one H200.
set -uo pipefail
cd "$(dirname "$0")/.."
dry=()
if [ "${1:-}" = "--cpu-dry-run" ]; then dry=(--cpu-dry-run); shift; fi
out=${1:-${OUT:-gpu-results}}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  # mpich by prefix (pip --target drops its lib/ with libmpi), mpi4py on PYTHONPATH
  flags=(-q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed)
  python3 -m pip install "${flags[@]}" --prefix /tmp/mpich .whl/mpich-*.whl || exit 3
  python3 -m pip install "${flags[@]}" --target /tmp/site .whl/mpi4py-*.whl || exit 3
  export PATH=/tmp/mpich/bin:$PATH LD_LIBRARY_PATH=/tmp/mpich/lib:${LD_LIBRARY_PATH:-}
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python3 scripts/gpu_check.py "$out" "${dry[@]}" 2>&1 | tee "$out/log.txt"
status=${PIPESTATUS[0]}
echo "gpu_check status: $status" | tee "$out/status.txt"
exit "$status"
