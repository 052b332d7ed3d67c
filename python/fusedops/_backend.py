"""Backend selection from Python: the per-call Context, `use_backend` and `backends`; the debug
checks and the bad-input reports of CUDA kernels (`debug_checks`, `check_errors`)."""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
from typing import Iterator, Optional, Union

import torch

from . import _C

# {op name or "*": backend id} forced by the innermost use_backend() blocks.
_forced: contextvars.ContextVar[Optional[dict[str, str]]] = contextvars.ContextVar("fusedops_forced", default=None)
_validate: contextvars.ContextVar[bool] = contextvars.ContextVar("fusedops_validate", default=False)


@contextlib.contextmanager
def use_backend(backend: str | None = None, /, **per_op: str) -> Iterator[None]:
    """Force a backend inside a ``with`` block.

    ``use_backend("ref")`` forces the float64 reference for every op;
    ``use_backend(l2norm="cpu")`` forces one op. Backend ids: ``ref``, ``cpu``, ``cuda_sm80``,
    ``cuda_sm90``. Takes precedence over the ``FUSEDOPS_BACKEND`` environment variable. A forced
    backend that cannot run the call raises an error that says why.
    """
    forced = dict(_forced.get() or {})
    if backend is not None:
        forced["*"] = backend
    forced.update(per_op)
    token = _forced.set(forced)
    try:
        yield
    finally:
        _forced.reset(token)


@contextlib.contextmanager
def debug_checks(enabled: bool = True) -> Iterator[None]:
    """Inside the block, every call checks the contents of its index, offset and label tensors
    before it runs and raises at once, also on CUDA, where that copies them to the host and
    synchronizes; after a CUDA call the kernels' own bad-input reports are read back (another
    synchronization) and raised. The environment variable ``FUSEDOPS_CHECK_INDICES=1`` turns the
    same checks on everywhere. Without them, CPU calls still check everything before any work;
    CUDA kernels keep bad values in bounds and report them, raised by :func:`check_errors` or by
    a later fusedops call."""
    token = _validate.set(enabled)
    try:
        yield
    finally:
        _validate.reset(token)


# The earlier name of debug_checks.
validation = debug_checks


def debug_checks_enabled() -> bool:
    """Whether the debug checks are on here (``debug_checks()`` or ``FUSEDOPS_CHECK_INDICES``)."""
    return _validate.get() or os.environ.get("FUSEDOPS_CHECK_INDICES", "") not in ("", "0")


# ---------------------------------------------------------------------------------------------
# Bad-input reports of CUDA kernels (fusedops/core/device_errors.h): one record per device in the
# library's device memory. Every _POLL_EVERY-th call on a device copies it asynchronously into
# pinned memory; a later poll that finds the copy done and the record set raises. No poll ever
# waits for the device, and none runs while a CUDA graph is being captured.
_POLL_EVERY = 64


def _report_message(fields: list[int], device: int, where: str) -> str:
    code, index, value, count = fields[0] & 0xFFFFFFFF, fields[1], fields[2], fields[3]
    return (f"fusedops: {_C.describe_device_error(code, index, value, count)} (reported by a CUDA "
            f"kernel on cuda:{device} {where}; the outputs of that call are defined but wrong; run "
            "inside fusedops.debug_checks() or with FUSEDOPS_CHECK_INDICES=1 to raise at the call)")


class _DeviceReports:
    __slots__ = ("index", "calls", "host", "event")

    def __init__(self, index: int):
        self.index = index
        self.calls = 0
        self.host: Optional[torch.Tensor] = None  # pinned int64 [4]: the record's 32 bytes
        self.event = None

    def poll(self, ctx) -> None:
        if torch.cuda.is_current_stream_capturing():
            return
        if self.event is not None:
            if not self.event.query():
                return
            self.event = None
            fields = self.host.tolist()
            if fields[0] & 0xFFFFFFFF or fields[3]:
                _C.clear_device_errors(ctx)
                raise ValueError(_report_message(fields, self.index, "during an earlier call"))
        if self.host is None:
            self.host = torch.zeros(4, dtype=torch.int64, pin_memory=True)
        _C.read_device_errors_async(ctx, self.host.data_ptr())
        self.event = torch.cuda.Event()
        self.event.record(torch.cuda.current_stream(self.index))


_reports: dict[int, _DeviceReports] = {}


def check_errors(device: Union[None, int, str, torch.device] = None) -> None:
    """Raise ``ValueError`` if a fusedops CUDA kernel has reported a bad input (an index, offset or
    label out of range) since the last check, and clear the report. Synchronizes the device
    (``device``, or every CUDA device fusedops has run on). Without CUDA this does nothing."""
    if device is None:
        indices = sorted(_reports)
    else:
        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if dev.type != "cuda":
            return
        indices = [dev.index if dev.index is not None else torch.cuda.current_device()]
    for i in indices:
        torch.cuda.synchronize(i)
        rep = _reports.get(i)
        if rep is not None:
            rep.event = None  # the pinned copy in flight is superseded by this read
        stream = torch.cuda.current_stream(i).cuda_stream
        _C.check_device_errors(_C.Context("cuda", i, stream, "", True, False))


def forced_backend(op: str) -> str:
    forced = _forced.get() or {}
    return forced.get(op, forced.get("*", ""))


# CPU Contexts by (forced backend, debug checks). The C++ calls only read a Context, so one object
# serves every CPU call with the same two settings: with cold caches (a call after other work)
# that took context() from ~60 to ~27 us a call (bench/notes/ARCHIVE.md, stop 63).
_cpu_contexts: dict[tuple[str, bool], _C.Context] = {}
atexit.register(_cpu_contexts.clear)  # before interpreter teardown, or nanobind reports leaks


def context(op: str, tensor: torch.Tensor, backend: str | None = None) -> _C.Context:
    """The Context for one call of `op` on `tensor`'s device and current CUDA stream (treat it as
    read-only: CPU calls share it)."""
    if not tensor.is_cuda:
        key = (forced_backend(op) if backend is None else backend, _validate.get())
        ctx = _cpu_contexts.get(key)
        if ctx is None:
            ctx = _cpu_contexts[key] = _C.Context("cpu", 0, 0, key[0], True, key[1])
        return ctx
    dev = tensor.device
    index = dev.index or 0
    stream = torch.cuda.current_stream(dev).cuda_stream
    ctx = _C.Context("cuda", index, stream, forced_backend(op) if backend is None else backend,
                     True, _validate.get())
    rep = _reports.get(index)
    if rep is None:
        rep = _reports[index] = _DeviceReports(index)
    rep.calls += 1
    if rep.calls >= _POLL_EVERY:
        rep.calls = 0
        rep.poll(ctx)
    return ctx


def backends(op: str | None = None) -> list[dict]:
    """What is registered for `op` (every op when None): one dict per (direction, backend) with
    its device, arch range, dtypes, priority, whether it can run in this process, and which
    backend a float32 / bfloat16 call would pick here on the CPU and on CUDA device 0."""
    ops = [op] if op is not None else list(_C.ops())
    out = []
    for name in ops:
        entries = _C.backends(name)
        if not entries:
            raise ValueError(f"fusedops: unknown op '{name}'; registered ops: {', '.join(_C.ops())}")
        for e in entries:
            chosen = {}
            for dev in ("cpu", "cuda"):
                if dev == "cuda" and _C.cuda_device_count() == 0:
                    continue
                for dt in ("float32", "bfloat16"):
                    chosen[f"{dev}/{dt}"] = _C.preferred_backend(name, e["direction"], dev, 0, dt)
            e["selected"] = {k: v == e["backend"] for k, v in chosen.items()}
            out.append(e)
    return out


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when its last dim is contiguous and its rows share one stride, else a copy."""
    if t.dim() == 0 or t.is_contiguous():
        return t
    if t.size(-1) > 1 and t.stride(-1) != 1:
        return t.contiguous()
    try:
        t.view(-1, t.size(-1))
    except RuntimeError:
        return t.contiguous()
    if t.numel() and t.dim() > 1 and t.size(-1) > 0:
        # view() also succeeds on stride-0 (expanded) leading dims; rows must not alias.
        flat = t.view(-1, t.size(-1))
        if flat.size(0) > 1 and flat.stride(0) < t.size(-1):
            return t.contiguous()
    return t
