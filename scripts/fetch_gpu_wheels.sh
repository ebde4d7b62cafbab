#!/usr/bin/env bash
# Fill .whl/ (gitignored) with the wheels scripts/gpu_check.sh installs on a GPU machine that has
# torch, numpy, rich, cloudpickle and pytest but no MPI library: the mpich wheel (libmpi and
# mpiexec) and the mpi4py that loads it, for CPython 3.12 on x86-64 Linux. Run here, once, with
# network access; the GPU machine needs none.
#
#   bash scripts/fetch_gpu_wheels.sh [PYTHON_VERSION]     # default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> "$(git rev-parse --git-path info/exclude)"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  "${platforms[@]}" -d .whl mpich==5.0.2 mpi4py==4.1.2
ls -l .whl
