#!/usr/bin/env bash
# The README's main command: sets up what is missing, builds the Python extension, runs the
# operator report on the default device (CUDA when present, else CPU), then the end-to-end demo
# (examples/train_hybrid.py: a small hybrid LM trained with fusedops and in plain PyTorch side by
# side, CPU fp32, a few minutes; with --quick 40 steps). Extra arguments go to bench/report.py
# (e.g. --quick, --ops l2norm, --json out.json, --plot out.png); FUSEDOPS_DEMO=0 skips the demo.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
source tools/setup.sh
mkdir -p build
# Without a visible GPU the report runs on the CPU: the extension is then built without CUDA,
# which takes a fraction of the time (FUSEDOPS_CUDA=ON forces the CUDA build).
if [ -z "${FUSEDOPS_CUDA:-}" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  export FUSEDOPS_CUDA=OFF
  echo "(no GPU visible: the Python extension is built without CUDA)"
fi
# build/dev: the folder tools/test.sh builds in too (it adds the C++ tests to the same build).
python -m pip install -q --no-build-isolation -e . -C build-dir=build/dev
python bench/report.py "$@"
if [ "${FUSEDOPS_DEMO:-1}" != "0" ]; then
  demo_args=()
  for a in "$@"; do [ "$a" = "--quick" ] && demo_args=(--steps 40); done
  echo
  echo "== end to end: examples/train_hybrid.py ${demo_args[*]:-} =="
  python examples/train_hybrid.py "${demo_args[@]}"
fi
# Hugging Face transformers: examples/hf_finetune.py trains a tiny Qwen3-Next with and without
# fusedops.transformers, side by side (CPU fp32, 40 steps; 10 with --quick).
if [ "${FUSEDOPS_DEMO:-1}" != "0" ]; then
  hf_args=()
  for a in "$@"; do [ "$a" = "--quick" ] && hf_args=(--steps 10); done
  echo
  echo "== Hugging Face transformers: examples/hf_finetune.py ${hf_args[*]:-} =="
  python examples/hf_finetune.py "${hf_args[@]}"
fi
