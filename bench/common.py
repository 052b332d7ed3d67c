"""Shared pieces of the operator report: the case description, timing, copy bandwidth, peak
memory, and the precision policy of docs/design.md section 6.

Timing (docs/design.md section 7):
  * CUDA: a CUDA event pair around each call, a 256 MiB buffer written between timed calls (not
    timed) so that every call starts with a cold L2, median of many runs after warm-up. A sleep
    kernel queued first keeps the GPU busy while the host enqueues every timed call, so the
    events time GPU work rather than launch gaps; the host's time per call is reported apart.
  * CPU: time.perf_counter around each call, a buffer larger than the last-level cache written
    between calls, median of repetitions that together take at least `min_time_s`; the median
    count of minor page faults per call is recorded beside the time (a call's first touches of
    fresh memory are part of its cost, and the source of much of the run-to-run spread).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from bench.fmt import fmt_bytes, fmt_err, fmt_time  # noqa: F401  (re-exported for bench/ops)

ROOT = Path(__file__).resolve().parents[1]

PASSES = ("fwd", "fwd+bwd")


# --------------------------------------------------------------------------------------------
# Cases


@dataclasses.dataclass
class Impl:
    """One implementation of a case: fusedops, PyTorch eager or a peer library.

    `fwd(inputs)` returns {output name: tensor}; `fwd_bwd(inputs)` runs the forward and the
    backward of the primary output with `inputs["dy"]` and returns {"dx": tensor}. Outputs have
    the rows of x as their leading dimension. `prepare(inputs)` runs (untimed) before every
    call, e.g. to restore a gradient buffer that the implementation overwrites in place.
    `setup()` runs once, untimed, before the first call (peers are imported there, after
    fusedops's first calls, so that their imports warm nothing fusedops's first call would pay).
    `status` is "ok" or why the implementation cannot run here ("not installed", ...).
    `workarounds` lists, one sentence each, anything the report changed in a peer so that it
    runs (e.g. a version guard bypassed for timing); they are recorded in the JSON and printed.
    """

    name: str
    fwd: Callable[[dict], dict] | None = None
    fwd_bwd: Callable[[dict], dict] | None = None
    status: str = "ok"
    note: str = ""
    prepare: Callable[[dict], None] | None = None
    setup: Callable[[], None] | None = None
    workarounds: list[str] = dataclasses.field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.status == "ok"

    def call(self, pass_name: str) -> Callable[[dict], dict]:
        return self.fwd if pass_name == "fwd" else self.fwd_bwd


@dataclasses.dataclass
class Case:
    """One operator at one shape and dtype, with every implementation that is compared.

    `reference(inputs)` returns the float64 results {pass: {output name: tensor}} on the rows it
    is given; `base(inputs)` the same from the plain PyTorch composite computed in the input
    dtype (the baseline of the precision policy). `bytes_moved[pass]` is the minimum traffic of
    the pass, used for every implementation so that their TB/s are comparable.
    """

    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    params: dict[str, Any]
    make_inputs: Callable[[torch.device, int], dict]
    impls: list[Impl]
    reference: Callable[[dict], dict]
    base: Callable[[dict], dict]
    bytes_moved: dict[str, int]
    bytes_note: dict[str, str]
    ref_row_budget_elems: int = 1 << 21
    variant: str = ""  # told apart in the label when two cases share op, shape and dtype
    # whether the report adds a torch.compile row (False where compiling the composite would take
    # minutes, e.g. a Python loop over hundreds of chunks that dynamo unrolls)
    compile: bool = True

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def label(self) -> str:
        tail = f" {self.variant}" if self.variant else ""
        return f"{self.op} {list(self.shape)} {dtype_name(self.dtype)}{tail}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


DTYPE_ALIASES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
}


def parse_dtypes(text: str | None) -> list[torch.dtype] | None:
    if not text:
        return None
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if part not in DTYPE_ALIASES:
            raise ValueError(f"unknown dtype '{part}'; choose from bf16, fp16, fp32")
        out.append(DTYPE_ALIASES[part])
    return out


def shapes_and_dtypes(consts: dict, device: torch.device, quick: bool, dtypes=None) -> tuple[list, list]:
    """A bench module's shapes and dtypes for one run, from its constants (`globals()`):
    GPU_SHAPES / GPU_QUICK_SHAPES / GPU_DTYPES on CUDA, the CPU_ ones elsewhere, the QUICK shapes
    with --quick, and the dtypes asked for (--dtype) before the module's own."""
    side = "GPU" if device.type == "cuda" else "CPU"
    shapes = consts[f"{side}_QUICK_SHAPES" if quick else f"{side}_SHAPES"]
    return shapes, dtypes or consts[f"{side}_DTYPES"]


def randn_inputs(shape, dtype, device, seed: int, names=("x", "dy")) -> dict:
    """Fresh standard-normal tensors (never zeros: they hide unwritten outputs), one per name,
    plus `x_req`, a leaf view of x that requires grad for the fwd+bwd pass."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name in names:
        out[name] = torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)
    out["x_req"] = out["x"].detach().requires_grad_()
    return out


def row_norm_bytes(shape, dtype) -> dict[str, int]:
    """The minimum traffic of a row normalisation that also returns a float32 statistic per row
    (l2norm, rmsnorm_without_weight): the forward reads x and writes y and the statistic; the
    backward reads one of x / y, dy and the statistic and writes dx."""
    d = shape[-1]
    n = math.prod(shape[:-1])
    e = torch.empty(0, dtype=dtype).element_size()
    fwd = 2 * n * d * e + 4 * n
    return {"fwd": fwd, "fwd+bwd": fwd + 3 * n * d * e + 4 * n}


def grad_of(out: torch.Tensor, x: torch.Tensor, grad_out: torch.Tensor | None = None) -> torch.Tensor:
    """d out / d x for one leaf x, seeded with grad_out (None for a scalar out such as a loss)."""
    (dx,) = torch.autograd.grad(out, x, grad_out)
    return dx


def compiled_impl(eager: Impl) -> Impl:
    """The plain PyTorch composite of `eager` under torch.compile (default mode): what a user gets
    for free. Each pass is compiled on its first call (counted in its first-call time); a pass
    whose composite cannot be compiled is reported as an error of this row, never of fusedops."""
    import torch._dynamo  # noqa: F401  (imported here so that fusedops' first calls never pay it)

    note = "torch.compile (default mode) of the eager composite"
    if not eager.available:
        return Impl("compile", status=eager.status, note=note)
    fwd = torch.compile(eager.fwd) if eager.fwd else None
    fwd_bwd = torch.compile(eager.fwd_bwd) if eager.fwd_bwd else None
    return Impl("compile", fwd, fwd_bwd, note=note, prepare=eager.prepare)


def peer_status(module: str, device: torch.device) -> str:
    """'ok' when the package of `module` is installed and `device` is CUDA (the peers are Triton
    kernels), else why not. Nothing is imported here: the import happens in the Impl's setup."""
    top = module.split(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return "not installed"
    if device.type != "cuda":
        return "CUDA only"
    return "ok"


# --------------------------------------------------------------------------------------------
# Precision policy (docs/design.md section 6): the one implementation in tests/common/tolerance.py
#
#   pass <=> err(ours, ref64) <= 2 * err(base, ref64) + floor(dtype) * max(1, max|ref64|)
#
# err is the max-abs error; base is the plain PyTorch composite in the input dtype; floor is two
# units in the last place at 1.0 of the dtype. NaN/Inf where the reference is finite fails.


def _load_tolerance():
    path = ROOT / "tests" / "common" / "tolerance.py"
    spec = importlib.util.spec_from_file_location("fusedops_tests_tolerance", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


tolerance = _load_tolerance()
TOLERANCE_SOURCE = "tests/common/tolerance.py"


@dataclasses.dataclass
class Verdict:
    passed: bool
    err: float
    rms_rel: float
    base_err: float
    tol: float


def check_close(out: torch.Tensor, base: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
                name: str = "") -> Verdict:
    """The pass rule for one output; `dtype` is the input dtype of the case. Outputs are
    compared element for element, so a [N, 1] and an [N] tensor of the same rows match."""
    if out.numel() != ref.numel() or base.numel() != ref.numel():
        return Verdict(False, math.inf, math.inf, math.nan, math.nan)
    v = tolerance.check_close(out.reshape(ref.shape), base.reshape(ref.shape), ref, dtype, name)
    return Verdict(v.passed, v.err, v.rms_rel, v.base_err, v.tol)


def row_sample(n_rows: int, row_len: int, budget_elems: int) -> torch.Tensor:
    """Rows checked against the float64 reference: all of them when they fit the budget, else
    the first and the last rows (so the first and the last blocks of a kernel are both seen)."""
    keep = max(2, budget_elems // max(1, row_len))
    if keep >= n_rows:
        return torch.arange(n_rows)
    half = keep // 2
    return torch.cat([torch.arange(half), torch.arange(n_rows - (keep - half), n_rows)])


def describe_rows(idx: torch.Tensor, n_rows: int) -> str:
    if idx.numel() == n_rows:
        return f"all {n_rows} rows"
    # two contiguous runs by construction
    breaks = (idx[1:] - idx[:-1] != 1).nonzero()
    if breaks.numel() != 1:
        return f"{idx.numel()} of {n_rows} rows"
    b = int(breaks[0]) + 1
    return (f"rows {int(idx[0])}-{int(idx[b - 1])} and {int(idx[b])}-{int(idx[-1])} "
            f"({idx.numel()} of {n_rows})")


def take_rows(t: torch.Tensor, n_rows: int, idx: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(n_rows, -1)[idx.to(t.device)]


# --------------------------------------------------------------------------------------------
# Timing


@dataclasses.dataclass
class Timing:
    median_s: float
    p20_s: float
    p80_s: float
    reps: int
    host_s_per_call: float | None = None  # CUDA: host time to enqueue one call (Python, launches)
    # CPU: the median count of the process's minor page faults during one call (first touches of
    # freshly mapped memory, which this VM charges ~1.5-2 us each; see bench/notes/ARCHIVE.md).
    minor_faults: int | None = None


def _summarize(samples: list[float]) -> Timing:
    s = sorted(samples)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    return Timing(med, s[int(0.2 * (n - 1))], s[int(math.ceil(0.8 * (n - 1)))], n)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def git_commit() -> dict:
    """The checkout's commit and whether its tree differs from it (FUSEDOPS_COMMIT names the
    commit where the tree is not a git checkout)."""
    info = {"commit": os.environ.get("FUSEDOPS_COMMIT") or None, "dirty": None}
    if info["commit"]:
        # Named by the caller (a tree exported from a commit, e.g. inside another checkout on the
        # GPU machine, where git would describe the enclosing repository instead).
        return info
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0:
            info["commit"] = head.stdout.strip()
            st = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"],
                                capture_output=True, text=True, timeout=10)
            info["dirty"] = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def write_study(lines: list[str], out: Path | None) -> None:
    """Prints a study's lines and writes them to out (a file under bench/results/.../studies)."""
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if out:
        out.write_text(text)


def study_commit() -> str:
    """The commit for a study's header: short, with '+changes' when the tree differs from it."""
    info = git_commit()
    c = (info["commit"] or "?")[:7]
    return c + ("+changes" if info["dirty"] else "")


def last_level_cache_bytes() -> int:
    """Size of the CPU's largest cache (Linux sysfs), 32 MiB when it cannot be read."""
    best = 0
    for size_file in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = size_file.read_text().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best or (32 << 20)


class Timer:
    """Times calls on one device (see the module docstring for the method)."""

    def __init__(self, device: torch.device, quick: bool, reps: int | None = None):
        self.device = device
        self.quick = quick
        if device.type == "cuda":
            flush_bytes = 256 << 20
            self.warmup = 3 if quick else 10
            self.reps = reps or (10 if quick else 100)
        else:
            flush_bytes = max(64 << 20, 2 * last_level_cache_bytes())
            # The correctness call just before the timing is the warm-up.
            self.warmup = 0
            # At least `reps` calls and min_time_s, or 3 calls once slow_time_s is spent.
            self.reps = reps or (3 if quick else 5)
            self.min_time_s = 0.0 if quick else 0.5
            self.slow_time_s = 1.5
            self.max_reps = max(self.reps, 3 if quick else 50)
        self.flush_buf = torch.empty(flush_bytes, dtype=torch.uint8, device=device)
        self.flush_bytes = flush_bytes

    def flush(self) -> None:
        self.flush_buf.fill_(0x5A)

    def time(self, fn: Callable[[], Any], prepare: Callable[[], None] | None = None) -> Timing:
        prepare = prepare or (lambda: None)
        for _ in range(self.warmup):
            prepare()
            out = fn()
            del out
        synchronize(self.device)
        if self.device.type == "cuda":
            return self._time_cuda(fn, prepare)
        return self._time_cpu(fn, prepare)

    def _sleep_cycles_per_s(self) -> float:
        if not hasattr(self, "_cycles_per_s"):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.cuda._sleep(10_000_000)
            e.record()
            torch.cuda.synchronize(self.device)
            self._cycles_per_s = 10_000_000 / max(1e-6, s.elapsed_time(e) * 1e-3)
        return self._cycles_per_s

    def _time_cuda(self, fn, prepare) -> Timing:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        # Host time to enqueue one timed iteration (Python, autograd, launches).
        t0 = time.perf_counter()
        for _ in range(2):
            prepare()
            self.flush()
            out = fn()
            del out
        self.host_s_per_call = (time.perf_counter() - t0) / 2
        torch.cuda.synchronize(self.device)
        # Keep the GPU busy while the host enqueues every timed call, so that the events time
        # the GPU's work and not gaps in which it waits for Python to launch the next kernel.
        # The margin is 4x the host time measured above: at 1.5x, a stop-25 run whose host was
        # slower during the timed loop timed hc_split_sinkhorn's 26 us of kernels as 0.8 ms.
        if hasattr(torch.cuda, "_sleep"):
            ahead_s = min(2.0, 4.0 * self.host_s_per_call * self.reps + 1e-3)
            torch.cuda._sleep(int(ahead_s * self._sleep_cycles_per_s()))
        for i in range(self.reps):
            prepare()
            self.flush()
            starts[i].record()
            out = fn()
            ends[i].record()
            del out
        torch.cuda.synchronize(self.device)
        t = _summarize([s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)])
        t.host_s_per_call = self.host_s_per_call
        return t

    def _time_cpu(self, fn, prepare) -> Timing:
        samples: list[float] = []
        faults: list[int] = []
        total = 0.0
        while len(samples) < self.max_reps and (len(samples) < self.reps or total < self.min_time_s):
            if len(samples) >= 3 and total >= self.slow_time_s:
                break
            prepare()
            self.flush()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            out = fn()
            t1 = time.perf_counter()
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            del out  # freeing the outputs is not part of the call
            samples.append(t1 - t0)
            total += t1 - t0
        t = _summarize(samples)
        t.minor_faults = sorted(faults)[len(faults) // 2]
        return t


def first_call(fn: Callable[[], Any], device: torch.device) -> float:
    """Wall time of one call, device synchronized before and after (lazy init, module loading
    and JIT compilation included)."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    t1 = time.perf_counter()
    del out
    return t1 - t0


def copy_bandwidth(device: torch.device, quick: bool) -> dict:
    """Device copy bandwidth: dst.copy_(src) on a large buffer, read + write bytes counted."""
    if device.type == "cuda":
        nbytes = (256 << 20) if quick else (1 << 30)
        reps = 10 if quick else 50
    else:
        nbytes = (32 << 20) if quick else (256 << 20)
        reps = 3 if quick else 7
    src = torch.randn(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    synchronize(device)
    samples = []
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for s, e in events:
            s.record()
            dst.copy_(src)
            e.record()
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) * 1e-3 for s, e in events]
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(src)
            samples.append(time.perf_counter() - t0)
    t = _summarize(samples)
    moved = 2 * src.numel() * src.element_size()
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"bytes_per_s": moved / t.median_s, "buffer_bytes": moved // 2,
            "median_s": t.median_s, "reps": t.reps}


class MachineLoad:
    """CPU time that other processes took during the run: the busy time of /proc/stat minus this
    process's own (Linux only). CPU timings on a shared machine are only as good as this is low."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                vals = [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        vals += [0] * (8 - len(vals))
        hz = os.sysconf("SC_CLK_TCK")
        user, nice, system, _idle, _iowait, irq, softirq, steal = vals
        own = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            r = resource.getrusage(who)
            own += r.ru_utime + r.ru_stime
        return time.monotonic(), (user + nice + system + irq + softirq) / hz, steal / hz, own

    def summary(self) -> dict | None:
        end = self._sample()
        if self.start is None or end is None:
            return None
        wall = max(1e-9, end[0] - self.start[0])
        others = max(0.0, (end[1] - self.start[1]) - (end[3] - self.start[3]))
        return {"wall_s": wall, "cores": os.cpu_count(), "other_processes_cpu_s": others,
                "other_processes_cores_avg": others / wall,
                "steal_cores_avg": (end[2] - self.start[2]) / wall}


# --------------------------------------------------------------------------------------------
# Peak extra memory

CPU_MEMORY_METHOD = ("CPU peak memory: torch's CPU allocator as seen by torch.profiler "
                     "(profile_memory=True): highest 'Total Allocated' during the call minus "
                     "the level before it; memory a library allocates outside torch is not seen")


@contextlib.contextmanager
def _quiet_stderr():
    """Silences the profiler's own log lines (they go to fd 2 from C++)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_extra_memory(fn: Callable[[], Any], device: torch.device) -> tuple[Any, int | None]:
    """Runs fn once; returns (its result, the peak of allocated bytes during the call above the
    level before it, outputs included). CUDA: torch.cuda.max_memory_allocated after
    reset_peak_memory_stats. CPU: see CPU_MEMORY_METHOD. None where it cannot be measured."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = fn()
        torch.cuda.synchronize(device)
        return out, torch.cuda.max_memory_allocated(device) - before
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return fn(), None
    try:
        with _quiet_stderr():
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                out = fn()
            with tempfile.TemporaryDirectory() as tmp:
                trace = Path(tmp) / "trace.json"
                prof.export_chrome_trace(str(trace))
                events = json.loads(trace.read_text()).get("traceEvents", [])
    except Exception:
        return fn(), None
    mem = [e["args"] for e in events
           if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]
    if not mem:
        return out, 0
    mem.sort(key=lambda a: a.get("Ev Idx", 0))
    if not all("Total Allocated" in a and "Bytes" in a for a in mem):
        return out, None
    level = mem[0]["Total Allocated"] - mem[0]["Bytes"]
    peak = max(a["Total Allocated"] for a in mem)
    return out, max(0, peak - level)


# --------------------------------------------------------------------------------------------
# Provenance: what ran, with what, built how

# Distributions whose versions every report records when they are installed: the peer libraries
# compared against and the compilers they bring.
PEER_DISTRIBUTIONS = ("flash-linear-attention", "fla-core", "liger-kernel", "flash-qla", "tilelang",
                      "nvidia-cutlass-dsl")


def distribution_versions(names=PEER_DISTRIBUTIONS) -> dict[str, str]:
    """{distribution: version} of those installed (importlib.metadata; nothing is imported)."""
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def cuda_driver_versions() -> dict[str, str | int | None]:
    """The NVIDIA driver (nvidia-smi) and the CUDA version its libcuda implements, or None."""
    out: dict[str, str | int | None] = {"nvidia_driver": None, "cuda_driver_api": None}
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            out["cuda_driver_api"] = f"{v.value // 1000}.{v.value % 1000 // 10}"
    except (OSError, AttributeError):
        pass
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            out["nvidia_driver"] = r.stdout.strip().splitlines()[0]
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return out


def provenance(fusedops, device: torch.device) -> dict:
    """Versions of everything that ran, every FUSEDOPS_* variable set and how fusedops was built.
    The kernels that ran are recorded per pass (see dispatch_trace)."""
    import platform

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "numpy": _version_of("numpy"), "fusedops": fusedops.__version__,
                "triton": _version_of("triton") or _version_of("pytorch-triton"),
                "torch_cuda": torch.version.cuda}
    if device.type == "cuda":
        versions.update(cuda_driver_versions())
    try:
        build = dict(fusedops._C.build_info())
    except AttributeError:  # an extension built before build_info existed
        build = {"built_with_cuda": fusedops.built_with_cuda()}
    return {
        "versions": versions,
        "peers": distribution_versions(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("FUSEDOPS_")},
        "build": build,
    }


def _version_of(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def dispatch_trace(fusedops):
    """fusedops.dispatch_trace() when the extension has it, else a trace that stays empty."""
    if hasattr(fusedops, "dispatch_trace"):
        with fusedops.dispatch_trace() as t:
            yield t
    else:
        class _Empty:
            events: list = []
        yield _Empty()
