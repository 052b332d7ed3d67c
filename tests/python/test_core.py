"""The Python layer's backend machinery: fusedops.backends, use_backend, FUSEDOPS_BACKEND.

Which backend ran is observed from the numbers: on float32 input the ``ref`` backend (float64
loops) returns the correctly rounded result, bit for bit equal to a float64 composite rounded to
float32, while the ``cpu`` backend (float32 math) differs from it in thousands of elements.
"""

from __future__ import annotations

import fusedops
import pytest
import torch

OPS = ["l2norm", "rmsnorm_without_weight"]
KEYS = {"backend", "direction", "device", "dtypes", "priority", "runnable_here", "selected"}


def _x() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(64, 256, generator=g, dtype=torch.float64) * 1.5 + 0.3).float()


def _run(op: str, x: torch.Tensor) -> torch.Tensor:
    if op == "l2norm":
        return fusedops.l2norm(x)
    return fusedops.rmsnorm_without_weight(x, return_normalized=True)[0]


def _correctly_rounded(op: str, x: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    ss = x64.square().sum(-1, keepdim=True)
    if op == "rmsnorm_without_weight":
        ss = ss / x.shape[-1]
    return (x64 * torch.rsqrt(ss + 1e-6)).float()


def ran(op: str) -> str:
    """'ref' or 'cpu': which backend computed `op` on float32 CPU input in the current context."""
    x = _x()
    y = _run(op, x)
    if torch.equal(y, _correctly_rounded(op, x)):
        return "ref"
    with fusedops.use_backend(**{op: "cpu"}):
        assert torch.equal(y, _run(op, x)), "neither the ref nor the cpu result"
    return "cpu"


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch):
    monkeypatch.delenv("FUSEDOPS_BACKEND", raising=False)


def test_the_probe_tells_ref_from_cpu():
    for op in OPS:
        with fusedops.use_backend(**{op: "ref"}):
            assert ran(op) == "ref"
        with fusedops.use_backend(**{op: "cpu"}):
            assert ran(op) == "cpu"


# ---------------------------------------------------------------------------------------------
# fusedops.backends


@pytest.mark.parametrize("op", OPS)
def test_backends_lists_every_direction_with_its_fields(op):
    entries = fusedops.backends(op)
    assert entries, op
    for e in entries:
        assert KEYS <= set(e), f"missing {KEYS - set(e)} in {e}"
        assert e["direction"] in ("fwd", "bwd")
        assert e["device"] in ("cpu", "cuda")
        assert isinstance(e["runnable_here"], bool) and isinstance(e["priority"], int)
        assert set(e["dtypes"]) <= {"float32", "bfloat16", "float16", "float64"}
    pairs = {(e["backend"], e["direction"]) for e in entries}
    for b in ("ref", "cpu"):
        assert {(b, "fwd"), (b, "bwd")} <= pairs
    ref = next(e for e in entries if e["backend"] == "ref")
    cpu = next(e for e in entries if e["backend"] == "cpu")
    assert "float64" in ref["dtypes"] and "float64" not in cpu["dtypes"]
    assert cpu["priority"] > ref["priority"]


@pytest.mark.parametrize("op", OPS)
def test_without_forcing_cpu_is_selected_for_float32_on_cpu(op):
    for e in fusedops.backends(op):
        if e["device"] == "cpu":
            assert e["selected"]["cpu/float32"] == (e["backend"] == "cpu"), e
            assert e["selected"]["cpu/bfloat16"] == (e["backend"] == "cpu"), e
    assert ran(op) == "cpu"


@pytest.mark.parametrize("op", OPS)
def test_float64_goes_to_ref_without_forcing(op):
    x = _x().double()
    y = _run(op, x)
    with fusedops.use_backend(**{op: "ref"}):
        assert torch.equal(y, _run(op, x))


@pytest.mark.parametrize("op", OPS)
def test_cuda_entries_match_the_build_and_the_device(op):
    cuda = [e for e in fusedops.backends(op) if e["device"] == "cuda"]
    assert bool(cuda) == fusedops.built_with_cuda()
    have_device = torch.cuda.is_available()
    for e in cuda:
        if not have_device:
            assert not e["runnable_here"], e
    if fusedops.built_with_cuda() and have_device:
        runnable = [e for e in cuda if e["runnable_here"] and e["direction"] == "fwd"]
        assert runnable, "a CUDA build with a device should run some CUDA backend"
        best = max(runnable, key=lambda e: e["priority"])
        for e in cuda:
            if e["direction"] == "fwd":
                assert e["selected"]["cuda/float32"] == (e is best), e


def test_hopper_builds_register_both_directions_of_every_sm90_op():
    """A cuda_sm90 op serves both directions (a caller who names the backend gets the whole
    call), on sm_90 only and above cuda_sm80: the chunked top levels, and the per-token forms
    (cuda_sm80's forward with the cluster backward since stop 65)."""
    sm90 = [e for e in fusedops.backends() if e["backend"] == "cuda_sm90"]
    if not sm90:
        pytest.skip("built without the sm_90a backends")
    ops = {e["op"] for e in sm90}
    assert ops == {"chunk_gated_delta_rule", "chunk_kda", "fused_recurrent_gated_delta_rule", "fused_recurrent_kda"}
    for op in ops:
        dirs = {e["direction"]: e for e in sm90 if e["op"] == op}
        assert set(dirs) == {"fwd", "bwd"}, op
        sm80 = {e["direction"]: e for e in fusedops.backends(op) if e["backend"] == "cuda_sm80"}
        for d, e in dirs.items():
            assert (e["min_arch"], e["max_arch"]) == (90, 90) and e["priority"] > sm80[d]["priority"], (op, d)


def test_runnable_backends_helper(runnable_backends):
    for op in OPS:
        cpu = runnable_backends(op, "cpu")
        assert {"cpu", "ref"} <= set(cpu) and cpu.index("cpu") < cpu.index("ref")  # by priority
        cuda = runnable_backends(op, "cuda")
        if torch.cuda.is_available() and fusedops.built_with_cuda():
            assert cuda and all(b.startswith("cuda") for b in cuda)
        else:
            assert cuda == []


def test_devices_fixture(devices):
    assert devices[0] == "cpu"
    assert ("cuda" in devices) == (torch.cuda.is_available() and fusedops.built_with_cuda())


def test_every_op_is_listed_when_no_op_is_named():
    assert {e["op"] for e in fusedops.backends()} >= set(OPS)


def test_unknown_op_is_a_value_error_listing_the_registered_ops():
    with pytest.raises(ValueError, match="nosuch") as info:
        fusedops.backends("nosuch")
    for op in OPS:
        assert op in str(info.value)


def test_public_names():
    for name in fusedops.__all__:
        assert hasattr(fusedops, name), name
    assert isinstance(fusedops.built_with_cuda(), bool)


# ---------------------------------------------------------------------------------------------
# use_backend


def test_use_backend_nests_and_restores():
    assert ran("l2norm") == "cpu"
    with fusedops.use_backend("ref"):
        assert ran("l2norm") == "ref" and ran("rmsnorm_without_weight") == "ref"
        with fusedops.use_backend(l2norm="cpu"):  # per op, inside a global forcing
            assert ran("l2norm") == "cpu"
            assert ran("rmsnorm_without_weight") == "ref"
            with fusedops.use_backend("nosuch", l2norm="ref"):  # per op beats "*" in one call
                assert ran("l2norm") == "ref"
                with pytest.raises(ValueError, match="'nosuch'"):
                    _run("rmsnorm_without_weight", _x())
            assert ran("rmsnorm_without_weight") == "ref"
        assert ran("l2norm") == "ref"
    assert ran("l2norm") == "cpu" and ran("rmsnorm_without_weight") == "cpu"


def test_use_backend_restores_after_an_exception():
    with pytest.raises(KeyError), fusedops.use_backend("ref"):
        assert ran("l2norm") == "ref"
        raise KeyError("boom")
    assert ran("l2norm") == "cpu"


def test_unknown_forced_backend_names_the_context_as_its_source():
    with fusedops.use_backend(l2norm="nosuch"), pytest.raises(ValueError, match="forced by the context"):
        fusedops.l2norm(_x())


# ---------------------------------------------------------------------------------------------
# FUSEDOPS_BACKEND


def test_environment_forces_a_backend(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_BACKEND", "l2norm=ref")
    assert ran("l2norm") == "ref"
    assert ran("rmsnorm_without_weight") == "cpu"
    sel = {(e["backend"], e["direction"]): e["selected"]["cpu/float32"] for e in fusedops.backends("l2norm")}
    assert sel[("ref", "fwd")] and not sel[("cpu", "fwd")]
    monkeypatch.setenv("FUSEDOPS_BACKEND", "ref")
    assert ran("l2norm") == "ref" and ran("rmsnorm_without_weight") == "ref"
    monkeypatch.setenv("FUSEDOPS_BACKEND", "*=ref,l2norm=cpu")
    assert ran("l2norm") == "cpu" and ran("rmsnorm_without_weight") == "ref"
    monkeypatch.delenv("FUSEDOPS_BACKEND")
    assert ran("l2norm") == "cpu" and ran("rmsnorm_without_weight") == "cpu"


def test_environment_unknown_backend_names_the_variable(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_BACKEND", "rmsnorm_without_weight=nosuch")
    with pytest.raises(ValueError, match="'nosuch'.*FUSEDOPS_BACKEND"):
        fusedops.rmsnorm_without_weight(_x())
    assert ran("l2norm") == "cpu"


def test_use_backend_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("FUSEDOPS_BACKEND", "l2norm=nosuch,rmsnorm_without_weight=ref")
    with fusedops.use_backend(l2norm="cpu"):
        assert ran("l2norm") == "cpu"
        assert ran("rmsnorm_without_weight") == "ref"  # not forced here: the environment decides
    with fusedops.use_backend("cpu"):  # a global forcing also beats a per-op variable
        assert ran("rmsnorm_without_weight") == "cpu"
        assert ran("l2norm") == "cpu"
    with pytest.raises(ValueError, match="FUSEDOPS_BACKEND"):
        fusedops.l2norm(_x())


# ---------------------------------------------------------------------------------------------
# Debug checks and the bad-input reports of CUDA kernels (fusedops/core/device_errors.h).


def test_device_error_reports_describe_the_condition_with_position_and_value():
    code = fusedops._C.device_error_code("some_op", "x[{index}] = {value} is out of range")
    assert code >= 1
    assert fusedops._C.device_error_code("some_op", "x[{index}] = {value} is out of range") == code
    assert fusedops._C.device_error_code("other_op", "x[{index}] = {value} is out of range") != code
    assert fusedops._C.describe_device_error(code, 3, -7, 1) == "some_op: x[3] = -7 is out of range"
    assert fusedops._C.describe_device_error(code, 3, -7, 5) == (
        "some_op: x[3] = -7 is out of range (5 reports; the first is shown)")
    assert fusedops._C.describe_device_error(0, 0, 0, 0) == ""


def test_debug_checks_set_the_context_and_nest():
    x = torch.zeros(2)
    ctx = fusedops._backend.context("l2norm", x)
    assert not ctx.validate
    with fusedops.debug_checks():
        assert fusedops._backend.context("l2norm", x).validate
        with fusedops.debug_checks(False):
            assert not fusedops._backend.context("l2norm", x).validate
        assert fusedops._backend.debug_checks_enabled()
    assert not fusedops._backend.context("l2norm", x).validate
    assert fusedops.validation is fusedops.debug_checks


def test_cpu_calls_share_one_context_per_setting():
    # context() caches CPU Contexts by (forced backend, debug checks): the same object for the same
    # settings, another one as soon as either changes.
    x = torch.zeros(2)
    ctx = fusedops._backend.context
    plain = ctx("l2norm", x)
    assert ctx("rmsnorm_without_weight", x) is plain and plain.backend == "" and not plain.validate
    with fusedops.use_backend(l2norm="ref"):
        forced = ctx("l2norm", x)
        assert forced is not plain and forced.backend == "ref"
        assert ctx("rmsnorm_without_weight", x) is plain
    with fusedops.debug_checks():
        checked = ctx("l2norm", x)
        assert checked is not plain and checked.validate and checked.backend == ""
    assert ctx("l2norm", x, "cpu").backend == "cpu"
    assert ctx("l2norm", x) is plain


def test_environment_turns_the_debug_checks_on(monkeypatch):
    ctx = fusedops._backend.context("l2norm", torch.zeros(2))
    monkeypatch.delenv("FUSEDOPS_CHECK_INDICES", raising=False)
    assert not fusedops._C.debug_checks(ctx) and not fusedops._backend.debug_checks_enabled()
    monkeypatch.setenv("FUSEDOPS_CHECK_INDICES", "0")
    assert not fusedops._C.debug_checks(ctx)
    monkeypatch.setenv("FUSEDOPS_CHECK_INDICES", "1")
    assert fusedops._C.debug_checks(ctx) and fusedops._backend.debug_checks_enabled()


def test_check_errors_without_cuda_work_does_nothing():
    fusedops.check_errors()
    fusedops.check_errors("cpu")


def _bad_sort(device):
    x = torch.randn(6, 4, device=device)
    sizes = torch.tensor([2, 2, 2], device=device)
    return fusedops.sort_chunks_by_idx(x, sizes, torch.tensor([0, 0, 1], device=device))[0]


def test_a_cuda_report_is_raised_by_a_later_call_without_a_sync():
    if not torch.cuda.is_available() or not fusedops.built_with_cuda():
        pytest.skip("needs a CUDA device and a CUDA build")
    fusedops.check_errors()
    _bad_sort("cuda")
    x = torch.randn(8, 16, device="cuda")
    with pytest.raises(ValueError, match=r"sort_chunks_by_idx: .*reported by a CUDA kernel on cuda:0 "
                                         r"during an earlier call"):
        for _ in range(4 * fusedops._backend._POLL_EVERY):
            fusedops.l2norm(x)
            torch.cuda.synchronize()  # let the asynchronous copy of the report land
    fusedops.check_errors()  # raised once, then cleared


def test_cuda_graph_capture_does_not_poll():
    if not torch.cuda.is_available() or not fusedops.built_with_cuda():
        pytest.skip("needs a CUDA device and a CUDA build")
    x = torch.randn(8, 16, device="cuda")
    fusedops.l2norm(x)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(2 * fusedops._backend._POLL_EVERY):
                y = fusedops.l2norm(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(y, fusedops.l2norm(x))
    fusedops.check_errors()
