#!/usr/bin/env bash
# Installs a fusedops wheel into a fresh virtual environment and runs tests/wheel/smoke.py there
# (every operator forward and backward on the CPU against the float64 backend): from an empty
# folder, so nothing of the source tree or its build can be imported, and with CUDA's compilers
# removed from PATH, so nothing is compiled at install or run time.
#
#   tools/test_wheel.sh [WHEEL]      default: the newest dist/*/fusedops-*.whl
#
# torch is not downloaded: the venv sees the torch of $PYTHON (default: the .venv of tools/setup.sh,
# else python3 on PATH) through a .pth file, read-only; fusedops itself comes only from the wheel (the script checks where it was
# imported from). Set TORCH_FROM_INDEX=1 to install the CPU build of torch into the venv instead.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
wheel="${1:-$(ls -t "$ROOT"/dist/*/fusedops-*.whl 2>/dev/null | head -1)}"
[ -f "$wheel" ] || { echo "test_wheel.sh: no wheel (build one with tools/build_wheel.sh cpu)" >&2; exit 2; }
wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ -x "$ROOT/.venv/bin/python" ] && PYTHON="$ROOT/.venv/bin/python"
fi
"$PYTHON" -m venv "$work/venv"
venv_py="$work/venv/bin/python"
if [ "${TORCH_FROM_INDEX:-0}" = 1 ]; then
  "$venv_py" -m pip install -q --index-url https://download.pytorch.org/whl/cpu torch
  "$venv_py" -m pip install -q numpy
else
  torch_site="$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')"
  site="$("$venv_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$torch_site" > "$site/torch-from-host.pth"
fi
"$venv_py" -m pip install -q --no-deps "$wheel"
echo "installed $(basename "$wheel") into a fresh venv ($work/venv)"
# PATH without nvcc (every folder that holds one is left out) and without other venvs: the wheel
# must not need the CUDA compiler to import or run.
clean_path="$work/venv/bin"
IFS=: read -r -a dirs <<< "$PATH"
for d in "${dirs[@]}"; do
  [ -n "$d" ] && [ ! -e "$d/nvcc" ] && [[ "$d" != *.venv* ]] && clean_path="$clean_path:$d"
done
cp "$ROOT/tests/wheel/smoke.py" "$work/smoke.py"
cd "$work"
env -u PYTHONPATH PATH="$clean_path" "$venv_py" - <<'PY'
import os, shutil, sys
import fusedops
here = os.path.realpath(os.path.dirname(fusedops.__file__))
venv = os.path.realpath(sys.prefix)
assert here.startswith(venv), f"fusedops imported from {here}, not from the fresh venv {venv}"
assert shutil.which("nvcc") is None, f"nvcc is still on PATH: {shutil.which('nvcc')}"
print(f"fusedops {fusedops.__version__} imported from {here}")
PY
env -u PYTHONPATH PATH="$clean_path" "$venv_py" smoke.py
