"""Backend selection from Python: the per-call Context, `use_backend` and `backends`."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

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
def validation(enabled: bool = True) -> Iterator[None]:
    """Run the checks that read tensor contents (they may synchronize the device)."""
    token = _validate.set(enabled)
    try:
        yield
    finally:
        _validate.reset(token)


def forced_backend(op: str) -> str:
    forced = _forced.get() or {}
    return forced.get(op, forced.get("*", ""))


def context(op: str, tensor: torch.Tensor, backend: str | None = None) -> _C.Context:
    """The Context for one call of `op` on `tensor`'s device and current CUDA stream."""
    dev = tensor.device
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
    return _C.Context(
        dev.type,
        dev.index or 0,
        stream,
        forced_backend(op) if backend is None else backend,
        True,
        _validate.get(),
    )


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
