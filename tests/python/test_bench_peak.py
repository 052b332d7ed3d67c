"""bench/gemm/peak_bench.cpp, the CPU peak behind the GEMM-bound rows' bound (bench/gemm/README.md):
it builds from its header's command and prints one issue rate per instruction and thread count."""

import shutil
import subprocess

import pytest

from bench.gemm import peak


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_peak_bench_builds_and_reports_positive_rates(tmp_path):
    # The build line is the one the file's header gives.
    assert " ".join(peak.BUILD) + " bench/gemm/peak_bench.cpp" in peak.SRC.read_text()
    exe = peak.build(tmp_path / "peak_bench")
    out = subprocess.run([str(exe), "0.02"], check=True, capture_output=True, text=True, timeout=60).stdout
    rows = peak.rows(out)
    names = [r[0] for r in rows]
    if "not measured: built without AVX-512" in out:  # a CPU without AVX-512: nothing to time
        assert not rows, out
        return
    assert "fp32 fma" in names, out
    if "bf16 dpbf16" not in names:  # a CPU without AVX512-BF16 says so instead
        assert "not measured: built without AVX512-BF16" in out, out
    for name, rate1, gflops1, threads, rate_all, gflops_all in rows:
        flops = 64 if name.startswith("bf16") else 32
        assert rate1 > 0 and rate_all > 0
        # GFLOP/s is the instruction rate times the instruction's flops (printed rounding aside).
        assert abs(gflops1 - rate1 * flops) <= 0.01 * flops + 0.1
        assert abs(gflops_all - rate_all * flops) <= 0.01 * flops + 0.1
        assert threads >= 1
