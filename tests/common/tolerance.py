"""The precision policy of docs/design.md section 6, shared by every Python test (mirrors tolerance.h).

    pass  <=>  err(ours, ref64) <= 2 * err(base, ref64) + floor(dtype) * max(1, max|ref64|)

err is the max-abs error against the float64 oracle; ``base`` is the plain PyTorch composite run
in the input dtype (the "small-op" baseline); floor(dtype) is two units in the last place at 1.0.
NaN or Inf where the reference is finite always fails. The RMS-relative error ||a-b|| / ||b|| is
reported alongside. ``report`` records every comparison so a run can list them (pytest option
``--precision-report``, see tests/python/conftest.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import torch

_FLOORS = {
    # float64 results differ from the oracle only by summation order: 64 ulps.
    torch.float64: 64 * 2.220446049250313e-16,
    torch.float32: 2 * 1.1920928955078125e-07,
    torch.float16: 2 * 9.765625e-04,
    torch.bfloat16: 2 * 7.8125e-03,
}
_NAMES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


def _dtype(dtype: Union[torch.dtype, str]) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype not in _NAMES:
            raise ValueError(f"tolerance: no floor for dtype '{dtype}'; known: {', '.join(_NAMES)}")
        return _NAMES[dtype]
    return dtype


def floor_for(dtype: Union[torch.dtype, str]) -> float:
    """Two units in the last place at 1.0 for a floating dtype (torch.dtype or its name)."""
    dtype = _dtype(dtype)
    if dtype not in _FLOORS:
        raise ValueError(f"tolerance: no floor for dtype {dtype}")
    return _FLOORS[dtype]


def coarsest(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype with the largest floor (e.g. the tolerance dtype of a bf16 output of an fp32 op)."""
    return max((_dtype(d) for d in dtypes), key=floor_for)


def _as64(t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)
    return t.detach().to("cpu", torch.float64)


def _check_shapes(a: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    if tuple(a.shape) != tuple(ref.shape):
        raise AssertionError(f"{what} has shape {list(a.shape)}, the reference {list(ref.shape)}")


def scale_of(t) -> float:
    """max(1, max |t|): the scale of a relative bound (1 for an empty tensor; gradients are not
    tracked)."""
    t64 = _as64(t)
    return max(1.0, float(t64.abs().max())) if t64.numel() else 1.0


def max_abs_error(a, ref) -> float:
    """max |a - ref|; inf when a is NaN/Inf where ref is finite; 0 for empty tensors."""
    a64, r64 = _as64(a), _as64(ref)
    _check_shapes(a64, r64, "tensor")
    if a64.numel() == 0:
        return 0.0
    if bool((~torch.isfinite(a64) & torch.isfinite(r64)).any()):
        return math.inf
    diff = (a64 - r64).abs()
    # Where the reference itself is NaN the element does not count (as std::max(e, NaN) in C++).
    diff = torch.where(torch.isnan(diff), torch.zeros_like(diff), diff)
    return float(diff.max())


def rms_relative_error(a, ref) -> float:
    """||a - ref|| / ||ref|| (the plain norm of the difference when ref is all zeros)."""
    a64, r64 = _as64(a), _as64(ref)
    _check_shapes(a64, r64, "tensor")
    num = float(torch.linalg.vector_norm(a64 - r64)) if a64.numel() else 0.0
    den = float(torch.linalg.vector_norm(r64)) if r64.numel() else 0.0
    return num / den if den > 0 else num


@dataclass
class Verdict:
    name: str
    passed: bool
    err: float
    base_err: float
    tol: float
    rms_rel: float

    def describe(self) -> str:
        return (f"{self.name}: max-abs err {self.err:.3e} vs tolerance {self.tol:.3e} "
                f"(base err {self.base_err:.3e}), rms-rel {self.rms_rel:.3e}")


_REPORT: list[tuple[str, float, float, float, float]] = []


def report(name: str, err: float, base_err: float, rms_rel: float, tol: float | None = None) -> None:
    """Record one comparison (name, err, base_err, rms_rel[, tol]) for the precision report."""
    _REPORT.append((name, err, base_err, rms_rel, math.nan if tol is None else tol))


def reported() -> list[tuple[str, float, float, float, float]]:
    """Every comparison recorded so far: (name, err, base_err, rms_rel, tol)."""
    return list(_REPORT)


def check_close(ours, base, ref, dtype: Union[torch.dtype, str], name: str = "") -> Verdict:
    """Apply the pass rule without raising; records the comparison with `report`."""
    ours64, base64, ref64 = _as64(ours), _as64(base), _as64(ref)
    _check_shapes(ours64, ref64, f"{name}: ours")
    _check_shapes(base64, ref64, f"{name}: base")
    finite_ref = ref64[torch.isfinite(ref64)]
    ref_max = max(1.0, float(finite_ref.abs().max())) if finite_ref.numel() else 1.0
    err = max_abs_error(ours64, ref64)
    base_err = max_abs_error(base64, ref64)
    if not math.isfinite(base_err):
        base_err = 0.0  # a base that overflows earns no slack
    tol = 2 * base_err + floor_for(dtype) * ref_max
    rms_rel = rms_relative_error(ours64, ref64)
    v = Verdict(name, err <= tol, err, base_err, tol, rms_rel)
    report(name, err, base_err, rms_rel, tol)
    return v


def assert_close(ours, base, ref, dtype: Union[torch.dtype, str], name: str = "") -> Verdict:
    """Fail (AssertionError) unless err(ours, ref) <= 2*err(base, ref) + floor(dtype)*max(1, max|ref|)."""
    v = check_close(ours, base, ref, dtype, name)
    if not v.passed:
        raise AssertionError(v.describe())
    return v
