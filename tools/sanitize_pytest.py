"""Runs pytest with fusedops' extension module replaced by a sanitizer build of it.

    python tools/sanitize_pytest.py build/asan-py/_C.cpython-311-x86_64-linux-gnu.so [pytest args]

The module is loaded as ``fusedops._C`` before fusedops is imported, so the Python package from
the repository (or the installed one) runs on top of the instrumented C++ core. Used by
tools/sanitize.sh with the ASan runtime preloaded.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def main() -> int:
    if len(sys.argv) < 2 or not Path(sys.argv[1]).is_file():
        print(__doc__, file=sys.stderr)
        return 2
    import torch  # noqa: F401  (fusedops imports torch first as well)

    spec = importlib.util.spec_from_file_location("fusedops._C", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["fusedops._C"] = module
    import fusedops

    if fusedops._C is not module:
        print("sanitize_pytest: fusedops did not pick up the sanitizer build", file=sys.stderr)
        return 2
    import pytest

    return pytest.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
