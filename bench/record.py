"""The results record: the text form of a report JSON, and the layout it is saved in.

    bench/results/<device>/<op>.json (+ .txt)       the current result of each operator
    bench/results/<device>/studies/<name>.json      special runs a doc cites (A/B, sweeps)

`<device>` is `h200`, `a100`, ... for a GPU (from its name) and `cpu` for the CPU; `<op>` is the
`op` of the report's cases (an operator family's bench module can report several ops, e.g. the
mHC module reports mhc_pre_bmm, mhc_post and hc_split_sinkhorn). `bench/report.py --save` writes
(replaces) the file of every op it ran; `--study NAME` writes one study file. A report JSON made
elsewhere (`--json`, e.g. by tools/gpu_check.sh on a GPU machine) goes into the layout with

    python bench/record.py save report.json             # every op of a full run
    python bench/record.py study NAME report.json       # one study file The text file is
rendered from the JSON by `render_report`, the same function that prints the live report, so the
two always agree. No torch here: the doc tables (bench/tables.py) and CI read results with it.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from bench.fmt import fmt_bytes, fmt_err, fmt_time  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PASSES = ("fwd", "fwd+bwd")
WIDTH = 100


# --------------------------------------------------------------------------------------------
# Layout


def device_folder(metadata: dict) -> str:
    """'cpu', or the GPU's model in lower case ('NVIDIA H200' -> 'h200', 'NVIDIA A100-SXM4-80GB'
    -> 'a100'); the whole name, simplified, when no model number is found."""
    if not str(metadata.get("device", "cpu")).startswith("cuda"):
        return "cpu"
    name = str(metadata.get("device_info", {}).get("name", "gpu")).lower()
    m = re.search(r"\b(gh|gb|[abhlv]|rtx ?)(\d{2,4})[a-z]?\b", name.replace("nvidia", ""))
    if m:
        return (m.group(1).replace(" ", "") + m.group(2))
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def split_by_op(results: dict) -> dict[str, dict]:
    """{op: the results with only that op's cases}, ops in the order the run met them."""
    out: dict[str, dict] = {}
    for case in results["cases"]:
        sub = out.setdefault(case["op"], {k: v for k, v in results.items() if k != "cases"})
        sub.setdefault("cases", []).append(case)
    return out


def write_pair(path: Path, results: dict) -> list[Path]:
    """Writes path (.json) and its .txt rendering atomically; returns both paths."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for p, text in ((path, json.dumps(results, indent=1, default=str) + "\n"),
                    (path.with_suffix(".txt"), render_report(results) + "\n")):
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(p)
        out.append(p)
    return out


def save_current(results: dict, root: Path = RESULTS, folder: str | None = None) -> list[Path]:
    """Writes (replaces) <root>/<device>/<op>.json and .txt for every op of the run."""
    folder = folder or device_folder(results["metadata"])
    written = []
    for op, sub in split_by_op(results).items():
        written += write_pair(root / folder / f"{op}.json", sub)
    return written


def save_study(results: dict, name: str, root: Path = RESULTS, folder: str | None = None) -> list[Path]:
    folder = folder or device_folder(results["metadata"])
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name):
        raise ValueError(f"study name '{name}' must be letters, digits and _.+- only")
    return write_pair(root / folder / "studies" / f"{name}.json", results)


# --------------------------------------------------------------------------------------------
# Text


COLUMNS = [  # header, width, align
    ("impl", 9, "<"), ("pass", 7, "<"), ("max-abs", 7, ">"), ("rms-rel", 7, ">"), ("check", 5, "<"),
    ("median", 8, ">"), ("BW", 6, ">"), ("%copy", 5, ">"), ("vs eager", 8, ">"),
    ("peak mem", 9, ">"), ("1st call", 8, ">"),
]


def fmt_row(cells) -> str:
    parts = []
    for (_header, width, align), cell in zip(COLUMNS, cells):
        cell = str(cell)
        parts.append(f"{cell:{align}{width}}" if len(cell) <= width else cell)
    return "  ".join(parts).rstrip()


def wrap(text: str, first: str = "   ", rest: str | None = None) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest or first,
                         break_on_hyphens=False)


def fmt_dispatch(events: list[dict]) -> str:
    """One pass's dispatch trace in one line: each top-level dispatch with its backend, the steps
    it dispatched grouped by backend, and kernel variants in brackets."""
    tops = [e for e in events if not e["kernel"] and not e.get("parent")]
    parts = []
    for top in tops:
        me = f"{top['op']} {top['direction']}"
        kernels = [e["kernel"] for e in events if e["kernel"] and e["op"] == top["op"]
                   and e["direction"] == top["direction"] and not e.get("parent")]
        text = f"{me} on {top['backend']}" + (f" [{', '.join(kernels)}]" if kernels else "")
        steps: dict[str, list[str]] = {}
        for e in events:
            if e.get("parent") != me or e["kernel"]:
                continue
            ks = [k["kernel"] for k in events if k["kernel"] and k["op"] == e["op"]
                  and k["direction"] == e["direction"] and k.get("parent") == me]
            name = e["op"] + (f" {e['direction']}" if e["direction"] != top["direction"] else "")
            name += f" [{', '.join(ks)}]" if ks else ""
            if name not in steps.setdefault(e["backend"], []):
                steps[e["backend"]].append(name)
        if steps:
            text += " (steps: " + "; ".join(f"{b}: {', '.join(n)}" for b, n in steps.items()) + ")"
        parts.append(text)
    loose = [e["kernel"] for e in events if e["kernel"] and not e["op"]]
    if loose:
        parts.append("outside any dispatch [" + ", ".join(loose) + "]")
    return "; ".join(parts) if parts else "nothing recorded"


def render_case(case: dict, device_type: str, copy_bw: float) -> str:
    bw_unit, bw_scale = ("TB/s", 1e12) if device_type == "cuda" else ("GB/s", 1e9)
    lines = []
    params = ", ".join(f"{k}={v}" for k, v in case["params"].items())
    variant = f" {case['variant']}" if case.get("variant") else ""
    lines.append(f"== {case['op']}  x{case['shape']} {case['dtype']}{variant}  ({params})")
    floors = ", ".join(
        f"{p} {fmt_bytes(case['bytes_moved'][p])} -> {fmt_time(case['bytes_moved'][p] / copy_bw)}"
        for p in PASSES)
    lines += wrap(f"bytes moved and floor at copy bandwidth: {floors}; checked on "
                  f"{case.get('checked_rows', '?')} vs float64 (errors of y / dx)")
    traced = [r for r in case["results"] if r.get("dispatch")]
    if traced:
        for r in traced:
            lines += wrap(f"{r['impl']} {r['pass']} ran: {fmt_dispatch(r['dispatch'])}", "   ", "     ")
    elif case.get("fusedops_backend"):
        b = case["fusedops_backend"]
        lines += wrap(f"fusedops backend preferred by the registry (recorded before dispatch traces; "
                      f"not a record of the kernels that ran): fwd={b.get('fwd')} bwd={b.get('bwd')}")
    headers = [h if h != "BW" else bw_unit for h, _, _ in COLUMNS]
    lines.append(fmt_row(headers))
    lines.append("-" * len(fmt_row(headers)))
    notes, problems = [], []
    by_impl: dict[str, dict[str, dict]] = {}
    for r in case["results"]:
        by_impl.setdefault(r["impl"], {})[r["pass"]] = r
    for impl, recs in by_impl.items():
        first = next(iter(recs.values()))
        if first.get("note") and impl != "fusedops":
            notes.append(f"{impl}: {first['note']}")
        for w in first.get("workarounds") or []:
            notes.append(f"{impl}: WORKAROUND: {w}")
        if all(r["status"] not in ("ok", "error") for r in recs.values()):
            status = first["status"]
            if len(status) > 60:
                lines.append(fmt_row([impl, "(could not run, see below)"]))
                problems.append(f"{impl}: {status}")
            else:
                lines.append(fmt_row([impl, f"({status})"]))
            continue
        for p in PASSES:
            rec = recs.get(p)
            if rec is None:
                continue
            if rec["status"] != "ok":
                lines.append(fmt_row([impl, p, "-", "-", "ERROR" if rec["status"] == "error" else "-"]))
                problems.append(f"{impl} {p}: {rec.get('error') or rec['status']}")
                continue
            chk = rec.get("check")
            prim = chk["outputs"].get(chk["primary"], {}) if chk else {}
            verdict = "pass" if chk and chk["passed"] else "FAIL"
            if chk and not chk["passed"]:
                for name, o in chk["outputs"].items():
                    if not o["passed"]:
                        problems.append(f"{impl} {p}: {name} max-abs {o['max_abs']:.3e} > "
                                        f"tolerance {o['tol']:.3e} (base {o['base_max_abs']:.3e})")
            sp = rec.get("speedup_vs_eager")
            bw = rec.get("bytes_per_s")
            lines.append(fmt_row([
                impl, p, fmt_err(prim.get("max_abs")), fmt_err(prim.get("rms_rel")), verdict,
                fmt_time(rec.get("time", {}).get("median_s")),
                f"{bw / bw_scale:.2f}" if bw else "-",
                f"{100 * rec['frac_of_copy']:.0f}%" if rec.get("frac_of_copy") else "-",
                f"{sp:.2f}x" if sp else "-",
                fmt_bytes(rec.get("peak_extra_bytes")),
                fmt_time(rec.get("first_call_s")),
            ]))
    host = []
    for impl, recs in by_impl.items():
        hs = [recs.get(p, {}).get("time", {}).get("host_s_per_call") for p in PASSES]
        if all(h is not None for h in hs):
            host.append(f"{impl} {fmt_time(hs[0])} / {fmt_time(hs[1])}")
    if device_type == "cuda" and host:
        notes.append("host time to issue one call, fwd / fwd+bwd (Python, dispatch, launches; the "
                     "GPU was kept busy meanwhile, so the times above exclude launch gaps): "
                     + ", ".join(host))
    for text in notes + problems:
        lines += wrap(text, "   * ", "     ")
    return "\n".join(lines)


def render_header(meta: dict) -> list[str]:
    d = meta.get("device_info", {})
    dev = str(meta.get("device", "cpu"))
    lines = [f"fusedops operator report  {meta.get('date', '?')}"]
    if dev.startswith("cuda"):
        cc = str(d.get("compute_capability", "?")).replace(".", "")
        lines.append(f"device {dev}: {d.get('name', '?')} (sm_{cc}, {d.get('sm_count', '?')} SMs)")
    else:
        lines.append(f"device {dev}: {d.get('name', '?')} ({d.get('cores', '?')} cores, "
                     f"torch threads {d.get('torch_threads', '?')})")
        if d.get("page_reporting_order") is not None:
            lines += wrap(f"memory: the host takes freed guest memory back (free page reporting, order "
                          f"{d['page_reporting_order']}): fresh pages cost more and vary from call to call "
                          "(bench/cpu_page_backing.py)", "", "   ")
    commit = meta.get("commit") or "unknown"
    lines.append(f"torch {meta.get('torch', '?')}, fusedops {meta.get('fusedops_version', '?')} "
                 f"commit {commit}{' (dirty tree)' if meta.get('dirty') else ''}")
    if meta.get("argv") is not None:
        lines += wrap("command: bench/report.py " + " ".join(meta["argv"]), "", "   ")
    prov = meta.get("provenance")
    if prov:
        v = prov.get("versions", {})
        items = [f"{k} {val}" for k, val in v.items() if val]
        lines += wrap("versions: " + ", ".join(items), "", "   ")
        b = prov.get("build", {})
        if b:
            built = [f"{b.get('cxx_compiler') or '?'}",
                     f"CUDA {b['cuda_compiler']} for {b.get('cuda_archs') or '?'}"
                     if b.get("cuda_compiler") else "without CUDA",
                     "-march=native" if b.get("native") else "portable CPU code",
                     b.get("cpu_gemm") or ("OpenBLAS" if b.get("blas") else ""), b.get("build_type") or ""]
            lines += wrap("fusedops built with: " + ", ".join(x for x in built if x), "", "   ")
        peers = prov.get("peers", {})
        lines += wrap("peers installed: " + (", ".join(f"{k} {val}" for k, val in peers.items())
                                             or "none"), "", "   ")
        env = prov.get("env", {})
        lines += wrap("FUSEDOPS_* set: " + (", ".join(f"{k}={val}" for k, val in env.items())
                                            or "none"), "", "   ")
    else:
        lines += wrap("provenance: not recorded (a run from before the report recorded versions, "
                      "environment and dispatched kernels)", "", "   ")
    if meta.get("record_note"):
        lines += wrap(meta["record_note"], "", "   ")
    cbw = meta.get("copy_bandwidth", {})
    if cbw:
        bw = cbw["bytes_per_s"]
        bw_text = f"{bw / 1e12:.2f} TB/s" if dev.startswith("cuda") else f"{bw / 1e9:.2f} GB/s"
        lines.append(f"copy bandwidth (copy of {fmt_bytes(cbw.get('buffer_bytes'))}, read+write): "
                     f"{bw_text}")
    return lines


def render_report(results: dict) -> str:
    meta = results["metadata"]
    dev_type = "cuda" if str(meta.get("device", "cpu")).startswith("cuda") else "cpu"
    copy_bw = meta.get("copy_bandwidth", {}).get("bytes_per_s") or float("nan")
    lines = render_header(meta) + [""]
    for case in results["cases"]:
        lines += [render_case(case, dev_type, copy_bw), ""]
    for n in meta.get("notes", []):
        lines += wrap(n, "note: ", "      ")
    if "ok" in results:
        lines.append(f"fusedops correctness: {'all checks pass' if results['ok'] else 'FAILED'}"
                     + (f"; wall time {meta['wall_s']:.1f} s" if meta.get("wall_s") else ""))
    if results.get("complete") is False:
        lines.append("INCOMPLETE: the run stopped before every case was done")
    return "\n".join(lines)


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="bench/record.py",
                                 description="Put a report JSON into bench/results/<device>/.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sv = sub.add_parser("save", help="write <device>/<op>.json + .txt for every op of a full run")
    sv.add_argument("report")
    st = sub.add_parser("study", help="write <device>/studies/NAME.json + .txt")
    st.add_argument("name")
    st.add_argument("report")
    for p in (sv, st):
        p.add_argument("--device-folder", default=None, help="default: from the run's device")
        p.add_argument("--results-dir", default=str(RESULTS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    results = load(args.report)
    meta = results["metadata"]
    if args.cmd == "save":
        if meta.get("quick") or results.get("complete") is False or any(
                a in meta.get("argv", []) for a in ("--cases", "--dtype")):
            print("record.py save: a full run only (not --quick, --cases, --dtype, nor an "
                  "incomplete run); use `study`", file=sys.stderr)
            return 2
        written = save_current(results, Path(args.results_dir), args.device_folder)
    else:
        written = save_study(results, args.name, Path(args.results_dir), args.device_folder)
    for w in written:
        print(f"wrote {w}")
    print("then: python bench/tables.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
