"""Number formatting shared by the report, its text rendering and the doc tables (no torch)."""

from __future__ import annotations

import math


def fmt_time(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us" if s < 1e-4 else f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms" if s < 1e-2 else f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def fmt_err(e: float | None) -> str:
    if e is None or (isinstance(e, float) and math.isnan(e)):
        return "-"
    if math.isinf(e):
        return "inf"
    if e == 0:
        return "0"
    return f"{e:.1e}"
