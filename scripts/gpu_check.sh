#!/usr/bin/env bash
# GPU checks of what exists, in one run on a machine with CUDA (the device tool's H200):
# CUDA tensors through the MPI transport (CUDA-aware if the MPI is, else staged through pinned
# host memory, and forced staging too) and through the torch.distributed transport, for every
# collective and algorithm, against the same collectives on CPU copies.
#
#   bash scripts/gpu_check.sh [OUTDIR]      # results in OUTDIR (default: $OUT or ./gpu-results)
#
# Python packages missing there (the mpich wheel, pytest-timeout) travel as wheels in .whl/
# (see the device tool's README); minipar itself is used from the working tree (PYTHONPATH).
set -uo pipefail
out=${1:-${OUT:-gpu-results}}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
[ -x /tmp/site/bin/mpiexec ] && export PATH=/tmp/site/bin:$PATH
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, mpi4py; print('torch', torch.__version__, 'mpi4py', mpi4py.__version__)"
  python3 -m minipar doctor 2>&1 | tail -25
} 2>&1 | tee "$out/env.txt"
status=0
for aware in auto 0; do
  if [ "$aware" = 0 ]; then export MINIPAR_CUDA_AWARE=0; else unset MINIPAR_CUDA_AWARE; fi
  python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider --timeout 500 \
    2>&1 | tee "$out/cuda_aware_$aware.txt" | tail -5
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
python3 -m pytest tests/test_transport.py -q -p no:cacheprovider -k "2-" 2>&1 | tail -3 \
  | tee "$out/transport_cpu.txt"
echo "gpu_check status: $status" | tee "$out/status.txt"
exit $status
