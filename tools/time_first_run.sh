#!/usr/bin/env bash
# Times the README's two commands from a bare clone of this repository, as a newcomer runs them:
# a fresh clone in a temporary folder, no build folder and no compiler cache (CCACHE_DISABLE=1),
# then `./tools/report.sh` and `./tools/test.sh` one after the other. Python packages: the clone's
# .venv sees the ones already installed for python3 (a venv with --system-site-packages), so the
# time of downloading torch is not counted; tools/setup.sh still checks the pinned versions.
# Writes bench/results/<device>/first_run.json (wall time of each command, the machine, its load);
# bench/tables.py puts the figures into the README.
#
#   tools/time_first_run.sh            # on the machine to describe (CPU only: no GPU visible)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
git clone -q "$ROOT" "$work/fusedops"
commit="$(git -C "$work/fusedops" rev-parse HEAD)"
cd "$work/fusedops"
python3 -m venv --system-site-packages .venv
export CCACHE_DISABLE=1
load() { awk '{print $1}' /proc/loadavg; }
cpu_busy() {  # busy and total jiffies of all CPUs
  awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat
}
run() {  # name, command...: wall seconds, cores the command kept busy, cores others kept busy
  local name="$1"; shift
  read -r b0 t0 < <(cpu_busy)
  local TIMEFORMAT="%R %U %S" times
  times="$( { time "$@" > "$work/$name.log" 2>&1; } 2>&1 )" ||
    { tail -30 "$work/$name.log" >&2; echo "$name failed" >&2; exit 1; }
  read -r b1 t1 < <(cpu_busy)
  read -r wall user sys <<< "$times"
  awk -v name="$name" -v w="$wall" -v u="$user" -v s="$sys" -v b=$((b1 - b0)) -v t=$((t1 - t0)) \
      -v n="$(nproc)" 'BEGIN{all = n * b / t; own = (u + s) / w;
                             printf "%s %.0f %.2f %.2f", name, w, own, (all > own ? all - own : 0)}'
}
report="$(run report ./tools/report.sh)"
test="$(run test ./tools/test.sh)"
python3 - "$ROOT" "$commit" "$report" "$test" <<'PY'
import datetime, json, os, platform, sys
from pathlib import Path
root, commit, *runs = sys.argv[1:]
name = platform.processor()
for line in Path("/proc/cpuinfo").read_text().splitlines():
    if line.startswith("model name"):
        name = line.split(":", 1)[1].strip()
        break
out = {
    "metadata": {"commit": commit, "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                 "cpu": name, "cores": os.cpu_count(),
                 "method": "bare git clone, .venv with --system-site-packages (no package download), "
                           "no compiler cache, no GPU visible; the commands one after the other"},
    "commands": {},
}
for r in runs:
    cmd, wall, own, others = r.split()
    out["commands"][f"./tools/{cmd}.sh"] = {"wall_s": int(wall), "own_cores_avg": float(own),
                                             "other_processes_cores_avg": float(others)}
path = Path(root) / "bench" / "results" / "cpu" / "first_run.json"
path.write_text(json.dumps(out, indent=1) + "\n")
print(f"wrote {path}")
print(json.dumps(out["commands"], indent=1))
PY
