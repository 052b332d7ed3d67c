"""The CPU GEMM study (issue 40, item 4): builds bench/gemm/gemm_bench.cpp, runs it on 1 and 2
OpenMP threads and writes one JSON result; --render writes the decision table of
src/ops/matmul_add/README.md from committed results.

    python -m bench.gemm.gemm_study [--out FILE] [--threads 1,2] [--isa ISA] [--min-seconds S]
    python -m bench.gemm.gemm_study --render bench/results/cpu/studies/gemm-*.json

The candidates (bench/gemm/README.md): "onednn" (fusedops::cpu::sgemm/bgemm of this tree),
"handwritten" (the AVX-512 kernels src/cpu/gemm.cpp had before, compiled from git history at
LEGACY_COMMIT) and "openblas" (the system's cblas_sgemm). --isa sets ONEDNN_MAX_CPU_ISA for the
run (e.g. AVX512_CORE_BF16: oneDNN as on a CPU with AVX-512 BF16 and no AMX, like Zen 4/5).
The load of the machine (/proc/loadavg) is recorded before and after each run: read the numbers
of a loaded machine as an upper bound.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "gemm-bench"
# The last commit whose src/cpu/gemm.cpp holds the hand-written AVX-512 kernels.
LEGACY_COMMIT = "c95fc3e"
LEGACY_FILES = ["src/cpu/gemm.cpp", "src/cpu/gemm.h", "src/cpu/parallel.h", "src/cpu/scratch.h", "src/core/half.h"]
README = ROOT / "src" / "ops" / "matmul_add" / "README.md"
BEGIN, END = "<!-- gemm-study:begin -->", "<!-- gemm-study:end -->"
FLAGS = "-std=c++20 -O3 -DNDEBUG -march=native -fno-trapping-math -fopenmp".split()


def _dnnl_prefix() -> Path:
    for p in (os.environ.get("DNNL_ROOT"), sys.prefix, "/usr/local", "/usr"):
        if p and (Path(p) / "include" / "oneapi" / "dnnl" / "dnnl.hpp").exists():
            return Path(p)
    sys.exit("gemm_study: oneDNN headers not found (run tools/setup.sh, or set DNNL_ROOT)")


def build() -> Path:
    BUILD.mkdir(parents=True, exist_ok=True)
    legacy = BUILD / "legacy"
    for f in LEGACY_FILES:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{LEGACY_COMMIT}:{f}"], check=True,
                              capture_output=True, text=True).stdout
        (legacy / f).parent.mkdir(parents=True, exist_ok=True)
        (legacy / f).write_text(text)
    dnnl = _dnnl_prefix()
    cxx = os.environ.get("CXX", "g++")
    legacy_obj = BUILD / "legacy_gemm.o"
    # The legacy kernels in their own namespace (fusedops -> fusedops_legacy), beside this tree's.
    subprocess.run([cxx, *FLAGS, "-Dfusedops=fusedops_legacy", f"-I{legacy}", "-c",
                    str(legacy / "src/cpu/gemm.cpp"), "-o", str(legacy_obj)], check=True)
    exe = BUILD / "gemm_bench"
    cmd = [cxx, *FLAGS, "-DGEMM_BENCH_LEGACY", f"-I{ROOT}", f"-I{ROOT / 'include'}", f"-I{dnnl / 'include'}",
           str(ROOT / "bench/gemm/gemm_bench.cpp"), str(ROOT / "src/cpu/gemm.cpp"), str(ROOT / "src/core/error.cpp"),
           str(legacy_obj), "-o", str(exe), f"-L{dnnl / 'lib'}", f"-Wl,-rpath,{dnnl / 'lib'}", "-ldnnl"]
    # OpenBLAS itself (its config header), not any cblas.h: the reference BLAS (libblas-dev) has
    # one too, without openblas_set_num_threads.
    if any(Path(d, "openblas_config.h").exists() for d in ("/usr/include/x86_64-linux-gnu", "/usr/include")):
        cmd[1:1] = ["-DGEMM_BENCH_OPENBLAS"]
        cmd.append("-lopenblas")
    subprocess.run(cmd, check=True)
    return exe


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def _machine() -> dict:
    info = {"platform": platform.platform(), "nproc": os.cpu_count()}
    try:
        cpu = Path("/proc/cpuinfo").read_text()
        info["cpu"] = re.search(r"model name\s*:\s*(.*)", cpu).group(1)
        flags = set(re.search(r"flags\s*:\s*(.*)", cpu).group(1).split())
        info["isa"] = sorted(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags)
    except (OSError, AttributeError):
        pass
    return info


def run(args) -> dict:
    exe = build()
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    env = dict(os.environ)
    if args.isa:
        env["ONEDNN_MAX_CPU_ISA"] = args.isa
    out = {"study": "cpu-gemm", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": git, "legacy_commit": LEGACY_COMMIT, "machine": _machine(), "onednn_max_cpu_isa": args.isa,
           "env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "OPENBLAS_", "ONEDNN_", "DNNL_"))},
           "command": " ".join(sys.argv), "runs": []}
    for t in [int(x) for x in args.threads.split(",")]:
        before = _loadavg()
        proc = subprocess.run([str(exe), "--threads", str(t), "--min-seconds", str(args.min_seconds),
                               "--min-reps", str(args.min_reps), "--candidates", args.candidates],
                              env=env, check=True, capture_output=True, text=True)
        res = json.loads(proc.stdout)
        res["loadavg_before"], res["loadavg_after"] = before, _loadavg()
        out["runs"].append(res)
        print(f"threads {t}: load {before} -> {res['loadavg_after']}", file=sys.stderr)
    return out


def _fmt_ms(ms: float) -> str:
    return f"{ms * 1e3:.0f} µs" if ms < 1 else f"{ms:.2f} ms"


def render(paths: list[str]) -> str:
    """The README's decision table: per study file, product and thread count, each candidate's
    median (minimum), GFLOP/s at the median and, on one thread, the median thread CPU time; and
    oneDNN's cold first call."""
    lines = []
    for path in paths:
        d = json.loads(Path(path).read_text())
        m = d["machine"]
        isa = f", ONEDNN_MAX_CPU_ISA={d['onednn_max_cpu_isa']}" if d.get("onednn_max_cpu_isa") else ""
        lines.append(f"`{Path(path).relative_to(ROOT) if Path(path).is_absolute() else path}`: {m.get('cpu', '?')} "
                     f"({m.get('nproc')} cores; {', '.join(m.get('isa', []))}{isa}), commit {d['commit']}, {d['date'][:10]}; "
                     "median (minimum) per call, GFLOP/s at the median, on one thread the calling thread's CPU "
                     "time (median); load "
                     + "; ".join(f"{r['threads']} thr {r['loadavg_before'].split()[0]}→{r['loadavg_after'].split()[0]}"
                                 for r in d["runs"]) + ".")
        lines.append("")
        cands = []
        for r in d["runs"]:
            for x in r["results"]:
                if x["candidate"] not in cands:
                    cands.append(x["candidate"])
        lines.append("| product | dtype | M×N×K | thr | " + " | ".join(cands) + " | oneDNN cold | oneDNN impl |")
        lines.append("|---|---|---|---|" + "---|" * len(cands) + "---|---|")
        for r in d["runs"]:
            rows: dict = {}
            for x in r["results"]:
                key = (x["product"], x["dtype"], x["M"], x["N"], x["K"])
                rows.setdefault(key, {})[x["candidate"]] = x
            for (prod, dt, M, N, K), by in rows.items():
                any_ = next(iter(by.values()))
                cells = []
                for c in cands:
                    x = by.get(c)
                    cpu = (f"; cpu {_fmt_ms(x['thread_cpu_median_ms'])}"
                           if x is not None and x.get("thread_cpu_median_ms") else "")
                    cells.append("—" if x is None else
                                 f"{_fmt_ms(x['median_ms'])} ({_fmt_ms(x['min_ms'])}) {x['gflops_median']:.0f}{cpu}")
                on = by.get("onednn")
                form = any_["form"]
                lines.append(f"| {prod} `{form}` | {dt} | {M}×{N}×{K} | {r['threads']} | " + " | ".join(cells)
                             + f" | {_fmt_ms(on['cold_ms']) if on else '—'} | {on['impl'] if on else '—'} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_readme(paths: list[str]) -> None:
    text = README.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    README.write_text(text[:start] + "\n" + render(paths) + text[end:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="JSON result (default bench/results/cpu/studies/gemm-<date>.json)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--isa", default="", help="ONEDNN_MAX_CPU_ISA for the run (e.g. AVX512_CORE_BF16)")
    ap.add_argument("--candidates", default="onednn,handwritten,openblas")
    ap.add_argument("--min-seconds", type=float, default=1.0, help="timed seconds per candidate and product")
    ap.add_argument("--min-reps", type=int, default=30)
    ap.add_argument("--render", nargs="+", metavar="JSON", help="write the README table from these results")
    args = ap.parse_args()
    if args.render:
        write_readme(args.render)
        return
    res = run(args)
    out = Path(args.out) if args.out else (
        ROOT / "bench/results/cpu/studies" / f"gemm-{res['date'][:10]}{'-' + args.isa.lower() if args.isa else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
