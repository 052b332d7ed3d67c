"""fusedops._onednn: the extension's oneDNN library (libdnnl.so.3) where its run-time search path
misses it (a source build in a venv that sees onednn-cpu-gomp in its base installation)."""

import ctypes
import os
from pathlib import Path

import fusedops
import pytest
import torch
from fusedops import _onednn


def _mapped_dnnl() -> set[str]:
    """Real paths of the libdnnl objects this process has mapped."""
    paths = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and "libdnnl" in os.path.basename(parts[5]):
            paths.add(os.path.realpath(parts[5]))
    return paths


def test_the_package_library_is_the_one_the_extension_uses():
    fusedops.matmul_add(*(torch.ones(4, 4, dtype=torch.bfloat16),) * 2, torch.zeros(4, 4))  # a oneDNN call
    mapped = _mapped_dnnl()
    assert len(mapped) == 1, f"one oneDNN library expected in the process, got {sorted(mapped)}"
    path = _onednn.library()
    # Without the package in sys.path's metadata (a build against a oneDNN installed elsewhere,
    # -Ddnnl_ROOT, as tools/gpu_check.sh does) the extension's search path served the one above.
    if path is not None:
        assert os.path.realpath(path) in mapped


def test_a_missing_library_is_loaded_from_the_package(monkeypatch):
    calls, loaded = [], []

    def import_module(name):
        calls.append(name)
        if len(calls) == 1:
            raise ImportError("libdnnl.so.3: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(_onednn.importlib, "import_module", import_module)
    monkeypatch.setattr(_onednn, "library", lambda: Path("/somewhere/lib/libdnnl.so.3"))
    monkeypatch.setattr(_onednn.ctypes, "CDLL", lambda path, mode=0: loaded.append((path, mode)))
    _onednn._ensure_loaded()
    assert calls == ["fusedops._C"]
    assert loaded == [("/somewhere/lib/libdnnl.so.3", ctypes.RTLD_GLOBAL)]


def test_other_import_errors_and_a_missing_package_still_raise(monkeypatch):
    def import_module(name):
        raise ImportError("libsomething_else.so: cannot open shared object file")

    monkeypatch.setattr(_onednn.importlib, "import_module", import_module)
    monkeypatch.setattr(_onednn.ctypes, "CDLL", lambda *a, **k: pytest.fail("nothing may be loaded"))
    with pytest.raises(ImportError, match="libsomething_else"):
        _onednn._ensure_loaded()

    def import_module_dnnl(name):
        raise ImportError("libdnnl.so.3: cannot open shared object file")

    monkeypatch.setattr(_onednn.importlib, "import_module", import_module_dnnl)
    monkeypatch.setattr(_onednn, "library", lambda: None)
    with pytest.raises(ImportError, match="libdnnl"):
        _onednn._ensure_loaded()
