"""Benchmark cases, one module per operator family.

Each module defines ``OP`` (the registry name of the op) and
``cases(device, quick, dtypes) -> list[bench.common.Case]``. A new module here is picked up by
``bench/report.py`` without further registration.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def registry() -> dict[str, ModuleType]:
    """{op name: module} for every module in this package that defines OP and cases()."""
    mods: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "OP") and hasattr(mod, "cases"):
            mods[mod.OP] = mod
    return mods
