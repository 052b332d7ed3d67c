#!/usr/bin/env python
"""The fusedops operator report (docs/design.md section 7, issue 2 item 5).

For every registered case (bench/ops/*.py) and every implementation (fusedops, PyTorch eager,
Liger-Kernel / flash-linear-attention when importable), per pass (forward, forward+backward):
error against the float64 reference with the precision policy's verdict, median time, achieved
bandwidth for the minimum bytes of the pass, percent of the device's copy bandwidth measured in
the same run, speed-up over PyTorch eager, peak extra memory and first-call latency.

    python bench/report.py [--device cpu|cuda] [--ops rmsnorm_without_weight,l2norm] [--quick]
                           [--dtype bf16] [--json PATH] [--plot PATH] [--reps N]

Exits 1 when a fusedops result fails its correctness check or raises (baselines that fail are
reported, not fatal), 2 on bad arguments. fusedops' first calls run at every case before anything
else; each other implementation's run just before its case is timed. With --json the file is
rewritten after every finished case ("complete": false until the end), so that a run cut short
keeps its finished cases. A peer's first call can spend minutes compiling and autotuning each new
shape.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WIDTH = 100


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="bench/report.py", description=__doc__.split("\n\n")[0],
        epilog="exit status: 1 when a fusedops result fails its correctness check or raises,\n"
               "2 on bad arguments. FUSEDOPS_COMMIT=<sha> names the commit when the tree is\n"
               "not a git checkout (a copy on a GPU machine).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda when torch sees a GPU and fusedops was built with CUDA")
    p.add_argument("--ops", default=None, help="comma-separated op names (default: all)")
    p.add_argument("--dtype", default=None,
                   help="comma-separated dtypes (bf16, fp16, fp32) replacing each op's defaults")
    p.add_argument("--quick", action="store_true", help="small shapes, few repetitions (CI smoke)")
    p.add_argument("--reps", type=int, default=None,
                   help="timed repetitions (CUDA: exactly; CPU: at least)")
    p.add_argument("--json", metavar="PATH", default=None, help="write every result as JSON")
    p.add_argument("--plot", metavar="PATH", default=None, help="write a PNG of speed-ups")
    p.add_argument("--save", action="store_true",
                   help="write (replace) the current result of every op run: "
                        "bench/results/<device>/<op>.json and .txt (a full run: not with --quick, "
                        "--cases or --dtype)")
    p.add_argument("--study", metavar="NAME", default=None,
                   help="write the whole run to bench/results/<device>/studies/NAME.json and .txt "
                        "(special runs a doc cites: A/B comparisons, sweeps, single cases)")
    p.add_argument("--results-dir", metavar="DIR", default=str(ROOT / "bench" / "results"),
                   help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", default="",
                   help="comma-separated implementation names not to run (e.g. fla: no Triton autotuning)")
    p.add_argument("--cases", metavar="REGEX", default=None,
                   help="run only the cases whose label matches this regular expression")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="a torch.compile row (the eager composite compiled, default mode) for every case "
                        "that has an eager composite; the default on CUDA")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="no torch.compile row; the default on the CPU, where Inductor's C++ compilation of "
                        "every case would take longer than the rest of the report")
    p.add_argument("--keep-triton-cache", action="store_true",
                   help="use the usual Triton cache (default: a fresh one, so that the peers' "
                        "first-call latency includes their compilation)")
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------------
# Metadata


def device_info(torch, device) -> dict:
    from bench import cpu_page_backing

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"name": torch.cuda.get_device_name(device),
                "compute_capability": f"{props.major}.{props.minor}",
                "memory_bytes": props.total_memory, "sm_count": props.multi_processor_count,
                "cuda_runtime": torch.version.cuda}
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"name": name, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "page_reporting_order": cpu_page_backing.page_reporting_order()}


def fusedops_backend(fusedops, case, device) -> dict:
    out = {}
    for direction in ("fwd", "bwd"):
        try:
            out[direction] = fusedops._C.preferred_backend(
                case.op, direction, device.type, device.index or 0,
                str(case.dtype).replace("torch.", ""))
        except Exception as e:
            out[direction] = f"? ({type(e).__name__})"
    return out


# --------------------------------------------------------------------------------------------
# Progress


class Progress:
    """A rich progress bar on a terminal, plain lines on stderr otherwise."""

    def __init__(self, total: int):
        self.total, self.done = total, 0
        self._rich = None
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress
            console = Console(width=WIDTH)
            if console.is_terminal:
                self._rich = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                          MofNCompleteColumn(), TimeElapsedColumn(),
                                          console=console, transient=True)
                self._task = self._rich.add_task("starting", total=total)
                self._rich.start()
        except ImportError:
            pass

    def step(self, text: str) -> None:
        self.done += 1
        if self._rich:
            self._rich.update(self._task, advance=1, description=text[:60])
        else:
            print(f"[{self.done:>3}/{self.total}] {text}", file=sys.stderr, flush=True)

    def shrink(self, n: int) -> None:
        self.total -= n
        if self._rich:
            self._rich.update(self._task, total=self.total)

    def print(self, text: str = "") -> None:
        if self._rich:
            self._rich.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, flush=True)

    def stop(self) -> None:
        if self._rich:
            self._rich.stop()


# --------------------------------------------------------------------------------------------
# Running


def short_error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def run_case_checks_and_timing(common, fusedops, case, inputs, records, timer, device, progress):
    """Correctness + peak memory (one call) and timing for every available implementation."""
    d = case.shape[-1]
    rows = common.row_sample(case.rows, d, case.ref_row_budget_elems)
    sliced = {k: common.take_rows(inputs[k], case.rows, rows) for k in ("x", "dy")}
    ref = case.reference(sliced)
    base = case.base(sliced)
    case_meta = {"ref_rows": common.describe_rows(rows, case.rows), "ref_row_count": rows.numel()}
    for impl in case.impls:
        for p in common.PASSES:
            rec = records[(impl.name, p)]
            if not impl.available:
                continue
            if rec["status"] != "ok":
                progress.step(f"{case.label}: {impl.name} {p} skipped ({rec['status']})")
                continue
            fn = impl.call(p)
            prep = (lambda impl=impl: impl.prepare(inputs)) if impl.prepare else None
            try:
                if prep:
                    prep()
                # The correctness call is traced: the kernels recorded are those of this pass.
                with common.dispatch_trace(fusedops) as trace:
                    out, peak = common.peak_extra_memory(lambda fn=fn: fn(inputs), device)
                if trace.events:
                    rec["dispatch"] = trace.events
                rec["peak_extra_bytes"] = peak
                outputs, ok = {}, True
                for name, r in ref[p].items():
                    if name not in out:
                        continue
                    got = common.take_rows(out[name], case.rows, rows)
                    v = common.check_close(got, base[p][name], r, case.dtype, f"{case.label} {impl.name} {p} {name}")
                    outputs[name] = {"max_abs": v.err, "rms_rel": v.rms_rel, "base_max_abs": v.base_err,
                                     "tol": v.tol, "passed": v.passed}
                    ok &= v.passed
                del out
                primary = next(iter(ref[p]))
                rec["check"] = {"passed": ok and bool(outputs), "primary": primary, "outputs": outputs}
                t = timer.time(lambda fn=fn: fn(inputs), prep)
                rec["time"] = {"median_s": t.median_s, "p20_s": t.p20_s, "p80_s": t.p80_s, "reps": t.reps}
                if t.minor_faults is not None:
                    rec["time"]["minor_faults"] = t.minor_faults
                if t.host_s_per_call is not None:
                    rec["time"]["host_s_per_call"] = t.host_s_per_call
            except Exception as e:
                rec["status"], rec["error"] = "error", short_error(e)
            msg = (f"{case.label}: {impl.name} {p} "
                   + (common.fmt_time(rec["time"]["median_s"]) if "time" in rec else rec["status"]))
            progress.step(msg)
    return case_meta


def finish_case(case, records, copy_bw):
    eager = {p: records.get(("eager", p), {}).get("time", {}).get("median_s") for p in ("fwd", "fwd+bwd")}
    for (_name, p), rec in records.items():
        t = rec.get("time", {}).get("median_s")
        if t:
            rec["bytes_per_s"] = case.bytes_moved[p] / t
            rec["frac_of_copy"] = rec["bytes_per_s"] / copy_bw
            rec["speedup_vs_eager"] = eager[p] / t if eager[p] else None


# --------------------------------------------------------------------------------------------
# Output (text rendering and the results layout: bench/record.py)


def write_plot(path, results):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups, series = [], {}
    for case in results["cases"]:
        for p in ("fwd", "fwd+bwd"):
            groups.append(f"{case['op']}\n{case['shape']} {case['dtype']}\n{p}")
            for r in case["results"]:
                if r["pass"] == p and r["impl"] != "eager":
                    series.setdefault(r["impl"], {})[len(groups) - 1] = r.get("speedup_vs_eager")
    names = [n for n in series if any(v for v in series[n].values())]
    colors = {"fusedops": "#1f77b4", "liger": "#ff7f0e", "liger-nw": "#d62728", "fla": "#2ca02c"}
    values = [v for n in names for v in series[n].values() if v]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.9 * len(groups) + 2), 4.8))
    width = min(0.35, 0.8 / max(1, max((sum(1 for n in names if series[n].get(g)) for g in range(len(groups))),
                             default=1)))
    labelled = set()
    for g in range(len(groups)):
        present = [n for n in names if series[n].get(g)]
        for i, name in enumerate(present):
            v = series[name][g]
            x = g + (i - (len(present) - 1) / 2) * width
            bar = ax.bar([x], [v], width * 0.95, color=colors.get(name),
                         label=None if name in labelled else name)[0]
            labelled.add(name)
            ax.annotate(f"{v:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    if values and max(values) / min(values) > 20:
        ax.set_yscale("log")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="PyTorch eager")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel("speed-up over PyTorch eager (median time)")
    meta = results["metadata"]
    commit = meta["commit"][:12] if meta.get("commit") else "commit unknown"
    commit += " (dirty tree)" if meta.get("dirty") else ""
    ax.set_title(f"fusedops operator report: {meta['device_info']['name']}, {commit}, "
                 f"{meta['date'][:10]}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.margins(y=0.15)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------


def write_json(path_arg, results) -> Path:
    path = Path(path_arg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.save and (args.quick or args.cases or args.dtype):
        print("report.py: --save records full runs only (no --quick, --cases or --dtype); "
              "use --study NAME for a partial run", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    if args.device != "cpu" and not args.keep_triton_cache and "TRITON_CACHE_DIR" not in os.environ:
        # Before anything imports Triton; removed at exit.
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="fusedops-report-triton-")
        atexit.register(shutil.rmtree, os.environ["TRITON_CACHE_DIR"], True)

    import fusedops
    import torch

    from bench import common, record
    from bench.ops import registry

    load = common.MachineLoad()

    cuda_ok = torch.cuda.is_available() and fusedops.built_with_cuda()
    dev_name = args.device or ("cuda" if cuda_ok else "cpu")
    if dev_name == "cuda" and not cuda_ok:
        why = "torch sees no GPU" if not torch.cuda.is_available() else "fusedops was built without CUDA"
        print(f"report.py: --device cuda is not possible here: {why}", file=sys.stderr)
        return 2
    device = torch.device(dev_name, torch.cuda.current_device()) if dev_name == "cuda" else torch.device("cpu")

    ops = registry()
    wanted = [o.strip() for o in args.ops.split(",")] if args.ops else list(ops)
    unknown = [o for o in wanted if o not in ops]
    if unknown:
        print(f"report.py: unknown op(s) {', '.join(unknown)}; available: {', '.join(ops)}", file=sys.stderr)
        return 2
    try:
        dtypes = common.parse_dtypes(args.dtype)
    except ValueError as e:
        print(f"report.py: {e}", file=sys.stderr)
        return 2

    cases = [c for o in wanted for c in ops[o].cases(device, args.quick, dtypes)]
    if args.cases:
        import re
        try:
            pattern = re.compile(args.cases)
        except re.error as e:
            print(f"report.py: bad --cases regex: {e}", file=sys.stderr)
            return 2
        cases = [c for c in cases if pattern.search(c.label)]
    with_compile = args.compile if args.compile is not None else device.type == "cuda"
    if with_compile and "compile" not in {s.strip() for s in args.skip.split(",")}:
        for c in cases:
            eager = next((i for i in c.impls if i.name == "eager"), None)
            if eager is not None and c.compile:
                c.impls.insert(c.impls.index(eager) + 1, common.compiled_impl(eager))
    skipped = {s.strip() for s in args.skip.split(",") if s.strip()}
    for c in cases:
        for impl in c.impls:
            if impl.name in skipped and impl.name != "fusedops":
                impl.status = "skipped (--skip)"
    if args.quick:
        for c in cases:
            c.ref_row_budget_elems = 1 << 18
    dinfo = device_info(torch, device)
    git = common.git_commit()
    results = {
        "metadata": {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "device": str(device), "device_info": dinfo, "torch": torch.__version__,
            "python": platform.python_version(), "fusedops_version": fusedops.__version__,
            "fusedops_built_with_cuda": fusedops.built_with_cuda(),
            "commit": git["commit"], "dirty": git["dirty"], "argv": sys.argv[1:] if argv is None else argv,
            "quick": args.quick, "seed": args.seed,
            "provenance": common.provenance(fusedops, device),
        },
        "cases": [],
    }
    meta = results["metadata"]

    n_avail = sum(len(common.PASSES) for c in cases for i in c.impls if i.available)
    progress = Progress(total=2 * n_avail + 1)
    out = progress.print
    out("\n".join(record.render_header(meta)))

    inputs = {}
    records = {}
    for ci, c in enumerate(cases):
        inputs[ci] = c.make_inputs(device, args.seed + ci)
        for impl in c.impls:
            for p in common.PASSES:
                records[(ci, impl.name, p)] = {"impl": impl.name, "pass": p, "status": impl.status,
                                               "note": impl.note}
    dynamo_imported_by = None
    # Warm PyTorch itself (allocator, kernels of the ops every implementation uses, autograd's
    # engine and its device threads) so that the first calls below measure the implementations,
    # not process start-up that any PyTorch program pays once.
    warm = torch.randn(64, 64, device=device, requires_grad=True)
    warm_out = (warm.float() * 2).to(torch.bfloat16)
    torch.autograd.grad(warm_out, warm, torch.ones_like(warm_out))  # first call imports sympy (~2 s)
    if device.type == "cuda":
        torch.cuda.synchronize(device)

    def first_calls(ci, impl):
        nonlocal dynamo_imported_by
        if impl.setup:
            t_setup = time.perf_counter()
            try:
                impl.setup()
                records[(ci, impl.name, common.PASSES[0])]["setup_s"] = time.perf_counter() - t_setup
            except Exception as e:  # a broken peer install is reported, not fatal
                impl.status = f"setup failed: {short_error(e)}"
                for p in common.PASSES:
                    records[(ci, impl.name, p)]["status"] = impl.status
                progress.shrink(2 * len(common.PASSES))
                return
        for p in common.PASSES:
            rec = records[(ci, impl.name, p)]
            try:
                if impl.prepare:
                    impl.prepare(inputs[ci])
                fn = impl.call(p)
                had_dynamo = "torch._dynamo" in sys.modules
                rec["first_call_s"] = common.first_call(lambda fn=fn, x=inputs[ci]: fn(x), device)
                if not had_dynamo and "torch._dynamo" in sys.modules:
                    # torch.library custom ops import torch._dynamo on their first eager call.
                    rec["first_call_imported_torch_dynamo"] = True
                    dynamo_imported_by = f"{impl.name} {p} ({cases[ci].label})"
            except Exception as e:
                rec["status"], rec["error"] = "error", short_error(e)
            progress.step(f"first call: {cases[ci].label}: {impl.name} {p}")

    # fusedops' first calls at every case before anything else, so that nothing has warmed it; each
    # peer's just before its case is timed, so that a run cut short (a peer's compilation can take
    # minutes per shape) keeps the cases it finished.
    for ci, c in enumerate(cases):
        for impl in c.impls:
            if impl.available and impl.name == "fusedops":
                first_calls(ci, impl)

    cbw = common.copy_bandwidth(device, args.quick)
    copy_bw = cbw["bytes_per_s"]
    progress.step("copy bandwidth")
    bw_text = f"{copy_bw / 1e12:.2f} TB/s" if device.type == "cuda" else f"{copy_bw / 1e9:.2f} GB/s"
    out(f"copy bandwidth (copy of {common.fmt_bytes(cbw['buffer_bytes'])}, read+write): {bw_text}")
    timer = common.Timer(device, args.quick, args.reps)
    out("")

    meta.update({
            "copy_bandwidth": cbw,
            "timing": {"warmup": timer.warmup, "reps": timer.reps,
                       "flush_bytes": timer.flush_bytes,
                       "method": "CUDA events, L2 flushed between calls" if device.type == "cuda"
                       else "perf_counter, cache flushed between calls",
                       **({"min_time_s": timer.min_time_s, "max_reps": timer.max_reps}
                          if device.type == "cpu" else {})},
            "tolerance": {"rule": "max_abs(ours) <= 2*max_abs(base in input dtype) + "
                                  "floor(dtype)*max(1, max|ref|); floor = 2 ulp at 1.0",
                          "source": common.TOLERANCE_SOURCE},
            "memory_method": ("torch.cuda.max_memory_allocated delta after reset_peak_memory_stats"
                              if device.type == "cuda" else common.CPU_MEMORY_METHOD),
            "first_call": "first call of each implementation at each case in this process "
                          "(fusedops' at every case first, after one small PyTorch autograd step "
                          "warmed PyTorch itself; each other implementation's just before its case "
                          "is timed); fwd+bwd after the fwd's first call",
            "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR") if device.type == "cuda" else None,
    })

    fusedops_ok = True
    for ci, c in enumerate(cases):
        t_case = time.perf_counter()
        for impl in c.impls:
            if impl.available and impl.name != "fusedops":
                first_calls(ci, impl)
        case_records = {(name, p): rec for (i, name, p), rec in records.items() if i == ci}
        info = run_case_checks_and_timing(common, fusedops, c, inputs[ci], case_records, timer,
                                          device, progress)
        info["backend"] = fusedops_backend(fusedops, c, device)
        finish_case(c, case_records, copy_bw)
        for impl in c.impls:  # a peer's setup may have changed its note or applied a workaround
            for p in common.PASSES:
                case_records[(impl.name, p)]["note"] = impl.note
                if impl.workarounds:
                    case_records[(impl.name, p)]["workarounds"] = list(impl.workarounds)
        del inputs[ci]
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for (name, _), rec in case_records.items():
            if name == "fusedops" and (rec["status"] != "ok" or not rec.get("check", {}).get("passed")):
                fusedops_ok = False
        results["cases"].append({
            "op": c.op, "shape": list(c.shape), "dtype": common.dtype_name(c.dtype),
            **({"variant": c.variant} if c.variant else {}),
            "params": c.params, "bytes_moved": c.bytes_moved, "bytes_note": c.bytes_note,
            "floor_time_s": {p: c.bytes_moved[p] / copy_bw for p in common.PASSES},
            # What the registry would pick for the case's device and dtype; what ran is each
            # result's "dispatch" (older files have only this, as "fusedops_backend").
            "registry_preference": info["backend"], "checked_rows": info["ref_rows"],
            "results": list(case_records.values()),
        })
        out(record.render_case(results["cases"][-1], device.type, copy_bw))
        out(f"   ({c.label} done in {time.perf_counter() - t_case:.1f} s)")
        out("")
        if args.json:  # every finished case, in case the run is cut short (complete: false)
            write_json(args.json, {**results, "complete": False})
    progress.stop()

    results["ok"] = fusedops_ok
    wall = time.perf_counter() - t_start
    results["metadata"]["wall_s"] = wall
    busy = load.summary()
    results["metadata"]["machine_load"] = busy
    notes = [
        f"check: {results['metadata']['tolerance']['rule']} (from {common.TOLERANCE_SOURCE}); "
        "every output is checked (y and rstd in fwd, dx in fwd+bwd), the table shows y / dx.",
        f"{'TB/s' if device.type == 'cuda' else 'GB/s'}: the minimum bytes of the pass over the "
        "median time, the same byte count for every implementation; %copy: of the copy bandwidth above.",
        "peak mem: " + results["metadata"]["memory_method"] + "; outputs included.",
        "1st call: " + results["metadata"]["first_call"]
        + (f"; Triton cache: {os.environ.get('TRITON_CACHE_DIR')}" if device.type == "cuda" else "."),
    ]
    if dynamo_imported_by:
        notes.append(f"the first call of {dynamo_imported_by} imported torch._dynamo (torch.library "
                     "custom ops do on their first eager call); most of that first-call time is "
                     "this import, which a process that already uses torch.compile has paid.")
    if device.type == "cpu":
        notes.append("CPU times include first-touch page faults of freshly allocated outputs, "
                     f"as a user's call does; timing: median of >= {timer.reps} calls and "
                     f">= {timer.min_time_s:g} s (3 calls once {timer.slow_time_s:g} s is spent), "
                     f"the correctness call as warm-up, a {common.fmt_bytes(timer.flush_bytes)} "
                     "buffer written between calls.")
    else:
        notes.append(f"timing: CUDA events, median of {timer.reps} calls after {timer.warmup} warm-up "
                     f"calls, {common.fmt_bytes(timer.flush_bytes)} L2 flush between calls.")
    if busy and busy["other_processes_cores_avg"] + busy["steal_cores_avg"] > 0.2:
        notes.append(f"WARNING: other processes kept {busy['other_processes_cores_avg']:.2f} of "
                     f"{busy['cores']} cores busy during this run (steal "
                     f"{busy['steal_cores_avg']:.2f}); {'host-side ' if device.type == 'cuda' else ''}"
                     "timings are slower and noisier than on an idle machine.")
    workarounds = sorted({f"{r['impl']}: {w}" for c in results["cases"] for r in c["results"]
                          for w in r.get("workarounds", [])})
    meta["provenance"]["workarounds"] = workarounds
    if workarounds:
        notes.append("peer workarounds applied in this run: " + "; ".join(workarounds))
    meta["notes"] = notes
    for n in notes:
        out("\n".join(record.wrap(n, "note: ", "      ")))
    out(f"fusedops correctness: {'all checks pass' if fusedops_ok else 'FAILED (see above)'}; "
        f"wall time {wall:.1f} s")

    results["complete"] = True
    if args.json:
        out(f"wrote {write_json(args.json, results)}")
    if args.save:
        for path in record.save_current(results, Path(args.results_dir)):
            out(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    if args.study:
        for path in record.save_study(results, args.study, Path(args.results_dir)):
            out(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    if args.plot:
        write_plot(args.plot, results)
        out(f"wrote {args.plot}")
    return 0 if fusedops_ok else 1


if __name__ == "__main__":
    sys.exit(main())
