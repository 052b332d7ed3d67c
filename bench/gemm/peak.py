"""bench/gemm/peak_bench.cpp from Python: its build line (the one the file's header gives) and its
rows. Used by tests/python/test_bench_peak.py and bench/cpu_cold_calls.py (the floors)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SRC = Path(__file__).resolve().parent / "peak_bench.cpp"
BUILD = ["g++", "-std=c++20", "-O2", "-march=native", "-fopenmp"]

_ROW = re.compile(r"^(fp32 fma|bf16 dpbf16) +1 thread: +([\d.]+) G instr/s = +([\d.]+) GFLOP/s \| "
                  r"(\d+) threads: +([\d.]+) G instr/s = +([\d.]+) GFLOP/s", re.M)


def build(exe: Path) -> Path:
    """Compiles peak_bench.cpp into `exe` (when missing or older than the source)."""
    if not exe.exists() or exe.stat().st_mtime < SRC.stat().st_mtime:
        exe.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*BUILD, str(SRC), "-o", str(exe)], check=True, timeout=300)
    return exe


def rows(text: str) -> list[tuple[str, float, float, int, float, float]]:
    """Its printed rows: (name, 1-thread G instr/s, 1-thread GFLOP/s, threads, all-threads G instr/s,
    all-threads GFLOP/s); none for an instruction the build could not time."""
    return [(m[0], float(m[1]), float(m[2]), int(m[3]), float(m[4]), float(m[5])) for m in _ROW.findall(text)]
