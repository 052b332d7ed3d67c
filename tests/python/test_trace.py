"""fusedops.dispatch_trace(): the registry records which backend served every call, sub-operators of
composed ops included, in the forward and in autograd's backward."""

import threading

import fusedops
import pytest
import torch
import torch.nn.functional as F


def keys(trace):
    return {(e["op"], e["direction"], e["backend"]) for e in trace.dispatches()}


def test_records_the_backend_that_ran_and_counts_calls():
    x = torch.randn(4, 64)
    fusedops.l2norm(x)  # before the block: not recorded
    with fusedops.dispatch_trace() as t:
        fusedops.l2norm(x)
        with fusedops.use_backend("ref"):
            fusedops.l2norm(x)
            fusedops.l2norm(x)
    assert [(e["op"], e["direction"], e["backend"], e["count"], e["parent"]) for e in t.events] == [
        ("l2norm", "fwd", "cpu", 1, ""), ("l2norm", "fwd", "ref", 2, "")]
    assert t.kernels() == []
    assert "l2norm fwd: ref x2" in t.summary()
    with fusedops.dispatch_trace() as empty:
        pass
    assert empty.events == []


def test_backward_and_other_threads_are_recorded():
    x = torch.randn(8, 32, requires_grad=True)
    with fusedops.dispatch_trace() as t:
        fusedops.rmsnorm_without_weight(x, return_normalized=True)[0].sum().backward()
        worker = threading.Thread(target=lambda: fusedops.l2norm(torch.randn(2, 16)))
        worker.start()
        worker.join()
    assert {("rmsnorm_without_weight", "fwd", "cpu"), ("rmsnorm_without_weight", "bwd", "cpu"),
            ("l2norm", "fwd", "cpu")} <= keys(t)


def test_a_composed_op_shows_the_steps_it_dispatched():
    torch.manual_seed(0)
    B, T, H, K = 1, 80, 2, 16
    q = F.normalize(torch.randn(B, T, H, K), dim=-1).requires_grad_()
    k = F.normalize(torch.randn(B, T, H, K), dim=-1).requires_grad_()
    v = torch.randn(B, T, H, K, requires_grad=True)
    g = F.logsigmoid(torch.randn(B, T, H)).requires_grad_()
    beta = torch.rand(B, T, H).requires_grad_()
    with fusedops.dispatch_trace() as t:
        o, _ = fusedops.chunk_gated_delta_rule(q, k, v, g, beta)
        o.sum().backward()
    got = keys(t)
    # The top level in both directions, and steps of the chunked algorithm below it, all on cpu.
    assert ("chunk_gated_delta_rule", "fwd", "cpu") in got
    assert ("chunk_gated_delta_rule", "bwd", "cpu") in got
    steps = {op for op, _, _ in got} - {"chunk_gated_delta_rule"}
    assert len(steps) >= 3, got
    assert {b for _, _, b in got} == {"cpu"}
    for e in t.dispatches():  # every step names the composed op it ran inside
        if e["op"] == "chunk_gated_delta_rule":
            assert e["parent"] == "", e
        else:
            assert e["parent"] in ("chunk_gated_delta_rule fwd", "chunk_gated_delta_rule bwd"), e


def cuda_ok():
    return torch.cuda.is_available() and fusedops.built_with_cuda()


@pytest.mark.skipif(not cuda_ok(), reason="needs a CUDA device and a CUDA build")
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_cuda_linear_attention_names_the_kernels_it_launched(family):
    """On CUDA the GDN / KDA backends name each kernel they launch (trace_kernel at every launch
    site), so a trace says which variant ran under which backend label (e.g. sm80 kernels inside a
    cuda_sm90 dispatch)."""
    torch.manual_seed(0)
    B, T, H, K = 2, 256, 4, 128
    dev = "cuda"
    q = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).bfloat16().requires_grad_()
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).bfloat16().requires_grad_()
    v = torch.randn(B, T, H, K, device=dev).bfloat16().requires_grad_()
    gshape = (B, T, H, K) if family == "kda" else (B, T, H)
    g = F.logsigmoid(torch.randn(*gshape, device=dev) + 2).requires_grad_()
    beta = torch.rand(B, T, H, device=dev).requires_grad_()
    fn = fusedops.chunk_kda if family == "kda" else fusedops.chunk_gated_delta_rule
    top = "chunk_kda" if family == "kda" else "chunk_gated_delta_rule"
    with fusedops.dispatch_trace() as t:
        o, _ = fn(q, k, v, g, beta)
        o.float().sum().backward()
        torch.cuda.synchronize()
    kernels = t.kernels()
    assert kernels, t.summary()
    assert all(e["kernel"] for e in kernels)
    directions = {e["direction"] for e in kernels}
    assert directions == {"fwd", "bwd"}, t.summary()
    # every kernel is attributed to a dispatch of the top level or of one of its steps
    assert all(e["op"] for e in kernels), t.summary()
    assert any(e["op"] == top or e["parent"].startswith(top) for e in kernels), t.summary()
