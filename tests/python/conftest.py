"""Shared pytest setup for the torch-layer tests.

* puts the repository root on sys.path so tests import ``tests.common.tolerance``;
* ``device`` (parametrized cpu / cuda) and ``devices`` fixtures; CUDA cases are skipped with the
  reason ("no CUDA device", "built without CUDA") when they cannot run;
* ``backend_case``: a test that takes it runs once per (device, backend, dtype) that the registry
  lists for the module's ``OP`` (``fusedops.backends(OP)``), so every backend is forced in turn;
  ``@pytest.mark.dtypes(...)`` narrows the dtypes;
* every test runs with ``torch.use_deterministic_algorithms(True)``, which makes ``torch.empty``
  fill new float tensors with NaN: outputs the library allocates are poisoned before the call;
* ``--precision-report`` prints every tolerance comparison after the run.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

# OpenMP threads (torch's and the extension's) spin-waiting on a machine with few, shared cores
# made torch's CPU ops sporadically 10-50x slower here; passive waiting keeps the suite fast and
# changes no result. Must be set before torch (and its libgomp) is loaded.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fusedops  # noqa: E402

from tests.common import tolerance  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


def cuda_skip_reason() -> str:
    """Why CUDA tests cannot run in this process ('' when they can)."""
    reasons = []
    if not torch.cuda.is_available():
        reasons.append("no CUDA device")
    if not fusedops.built_with_cuda():
        reasons.append("built without CUDA")
    return "; ".join(reasons)


def device_skip_reason(device: str) -> str:
    return cuda_skip_reason() if device == "cuda" else ""


def runnable_backends(op: str, device: str) -> list[str]:
    """Backend ids registered for `op` that can run here on `device` ('cpu' or 'cuda'), highest
    priority first, each listed once (a backend must serve both directions to be listed)."""
    entries = [e for e in fusedops.backends(op) if e["device"] == device and e["runnable_here"]]
    by_backend: dict[str, dict] = {}
    for e in entries:
        by_backend.setdefault(e["backend"], {})[e["direction"]] = e
    ids = [b for b, dirs in by_backend.items() if {"fwd", "bwd"} <= set(dirs)]
    return sorted(ids, key=lambda b: -by_backend[b]["fwd"]["priority"])


@dataclass(frozen=True)
class BackendCase:
    device: str
    backend: str
    dtype: torch.dtype

    @property
    def id(self) -> str:
        return f"{self.device}-{self.backend}-{str(self.dtype).replace('torch.', '')}"


def _backend_cases(op: str, only_dtypes) -> list:
    """pytest params for every registered (device, backend, dtype) of `op`."""
    params = []
    registered = {}
    try:
        entries = fusedops.backends(op)
    except ValueError as e:  # e.g. the extension was built before the op existed
        return [pytest.param(None, id="unregistered", marks=pytest.mark.skip(reason=str(e)))]
    for e in entries:
        key = (e["device"], e["backend"])
        info = registered.setdefault(key, {"dtypes": None, "runnable": True, "priority": e["priority"]})
        dts = set(e["dtypes"])
        info["dtypes"] = dts if info["dtypes"] is None else info["dtypes"] & dts
        info["runnable"] = info["runnable"] and e["runnable_here"]
    for device in ("cpu", "cuda"):
        keys = sorted((k for k in registered if k[0] == device), key=lambda k: -registered[k]["priority"])
        if not keys and device == "cuda":
            params.append(pytest.param(None, id="cuda", marks=pytest.mark.skip(
                reason=cuda_skip_reason() or "no CUDA backend is registered for " + op)))
            continue
        for key in keys:
            info = registered[key]
            skip = device_skip_reason(device)
            if not skip and not info["runnable"]:
                skip = f"backend {key[1]} cannot run on this device"
            for name, dt in DTYPES.items():
                if name not in info["dtypes"] or (only_dtypes and dt not in only_dtypes):
                    continue
                case = BackendCase(device, key[1], dt)
                marks = [pytest.mark.skip(reason=skip)] if skip else []
                params.append(pytest.param(case, id=case.id, marks=marks))
    return params


def pytest_addoption(parser):
    parser.addoption("--precision-report", action="store_true", default=False,
                     help="print every tolerance comparison (err, tolerance, base err, rms-rel)")


def pytest_configure(config):
    config.addinivalue_line("markers", "dtypes(*dtypes): restrict backend_case to these dtypes")


def pytest_generate_tests(metafunc):
    if "backend_case" in metafunc.fixturenames:
        op = getattr(metafunc.module, "OP", None)
        if op is None:
            raise pytest.UsageError(f"{metafunc.module.__name__} uses backend_case but defines no OP")
        marker = metafunc.definition.get_closest_marker("dtypes")
        only = tuple(marker.args) if marker else ()
        metafunc.parametrize("backend_case", _backend_cases(op, only))


@pytest.fixture(params=["cpu", "cuda"])
def device(request) -> str:
    reason = device_skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    return request.param


@pytest.fixture
def devices() -> list[str]:
    """Every device the tests can use in this process."""
    return ["cpu"] + ([] if cuda_skip_reason() else ["cuda"])


@pytest.fixture(name="runnable_backends")
def runnable_backends_fixture():
    return runnable_backends


@pytest.fixture(autouse=True)
def _nan_poisoned_empty():
    """torch.empty fills float tensors with NaN while deterministic algorithms are on."""
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn)


def seed_of(*parts) -> int:
    """A stable seed from a test's parameters (the same inputs on every run and every device)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def fresh_normal(shape, dtype, device, seed, mean=0.0, std=1.0) -> torch.Tensor:
    """Random normals drawn on the CPU in float64 (identical on every device), then cast."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(tuple(shape), generator=g, dtype=torch.float64) * std + mean
    return t.to(dtype).to(device)


@pytest.fixture(name="fresh_normal")
def fresh_normal_fixture():
    return fresh_normal


@pytest.fixture(name="seed_of")
def seed_of_fixture():
    return seed_of


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not config.getoption("--precision-report"):
        return
    rows = tolerance.reported()
    terminalreporter.section(f"precision report ({len(rows)} comparisons)")
    for name, err, base_err, rms_rel, tol in rows:
        terminalreporter.write_line(f"{name:<70} err {err:.2e} tol {tol:.2e} base {base_err:.2e} "
                                    f"rms-rel {rms_rel:.2e}")
