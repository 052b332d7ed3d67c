#!/usr/bin/env python
"""Fresh output pages on the CPU, and what PyTorch's THP_MEM_ALLOC_ENABLE=1 does to them.

An output above glibc's mmap threshold (32 MiB at most) is a fresh mapping on every call, so
every 4 KiB page of it is faulted in (and zeroed) by the kernel the first time the op writes
it. PyTorch's CPU allocator has an opt-in setting for that: with THP_MEM_ALLOC_ENABLE=1, an
allocation of 2 MiB or more is aligned to 2 MiB and advised as a transparent huge page region
(madvise MADV_HUGEPAGE), so it is faulted in 2 MiB at a time. fusedops leaves that choice to the
user (docs/tuning.md says why); this study measures it.

For each op it runs the operator report (bench/report.py --device cpu --ops OP) in a fresh
process without and then with the variable, ROUNDS times, and prints every timed row: median
(ms), minor page faults per call (median), the first call in the process (ms), the ratio to
eager, and whether the check passed. The machine's THP settings are printed first; the variable
changes nothing where THP is "never".

    python bench/cpu_thp.py [--ops clipped_swiglu sort_chunks_by_idx ...] [--rounds 2]
                            [--out bench/results/cpu/studies/NAME.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import study_commit, write_study  # noqa: E402

OPS = ["clipped_swiglu", "sort_chunks_by_idx", "chunk_loss", "chunk_gated_delta_rule"]
VAR = "THP_MEM_ALLOC_ENABLE"


def thp_settings() -> str:
    parts = []
    for name in ("enabled", "defrag"):
        try:
            parts.append(f"{name}: {Path('/sys/kernel/mm/transparent_hugepage', name).read_text().strip()}")
        except OSError:
            parts.append(f"{name}: unreadable")
    return "; ".join(parts)


def run_report(op: str, thp: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != VAR}
    if thp:
        env[VAR] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--device", "cpu", "--ops", op,
                        "--json", str(out)], env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        return json.loads(out.read_text())


def rows(report: dict):
    for case in report["cases"]:
        name = f"{case['op']} {case['shape']} {case['dtype']}"
        for r in case["results"]:
            t = r.get("time")
            if r.get("status") != "ok" or not t:
                continue
            yield (name, r["impl"], r["pass"]), (t["median_s"] * 1e3, t.get("minor_faults"),
                                                  r["first_call_s"] * 1e3, r.get("speedup_vs_eager"),
                                                  "pass" if (r.get("check") or {}).get("passed") else "FAIL")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", nargs="+", default=OPS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    commit = study_commit()
    lines = [f"cpu_thp at {commit}: transparent huge pages {thp_settings()}",
             f"each op's report run in a fresh process, {VAR} unset (off) then =1 (on), {args.rounds} rounds",
             "columns: median ms, minor faults per call, first call ms, x eager, check"]
    for op in args.ops:
        runs = {}
        for rnd in range(args.rounds):
            for thp in (False, True):
                runs[(rnd, thp)] = dict(rows(run_report(op, thp)))
        lines.append(f"== {op}")
        for key in runs[(0, False)]:
            lines.append(f"  {key[0]}  {key[1]} {key[2]}")
            for rnd in range(args.rounds):
                for thp in (False, True):
                    v = runs[(rnd, thp)].get(key)
                    if v is None:
                        continue
                    ms, faults, first, x, ok = v
                    xs = f"{x:5.2f}x" if x else "     -"
                    lines.append(f"    round {rnd + 1} {'on ' if thp else 'off'}  {ms:8.2f}  {faults!s:>6}  "
                                 f"{first:8.1f}  {xs}  {ok}")
    write_study(lines, args.out)


if __name__ == "__main__":
    main()
