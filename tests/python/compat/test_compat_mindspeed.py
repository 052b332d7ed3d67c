"""fusedops.compat.mindspeed: MindSpeed Ops' call forms (mindspeed_ops.api..., the autograd
Functions of MindSpeed-LLM's DeepSeek-V4 mHC, torch.ops.mindspeed_ops) as MindSpeed's docs,
tests and callers use them, against plain PyTorch composites (float64 oracle, input-dtype base)
and the native fusedops calls."""

from __future__ import annotations

import fusedops
import pytest
import torch
import torch.nn.functional as F
from fusedops.compat.mindspeed.api.atb.npu_matmul_add import npu_matmul_add_fp16, npu_matmul_add_fp32
from fusedops.compat.mindspeed.api.triton import chunk_gated_delta_rule as ms_gdn_module
from fusedops.compat.mindspeed.api.triton import convolution, kda, l2norm, mhc, sort_chunks_by_idx
from fusedops.compat.mindspeed.api.triton.fused_cross_entropy_loss import FusedCrossEntropyLossFunction
from fusedops.compat.mindspeed.api.triton.rmsnorm_without_weight import rmsnorm_without_weight
from fusedops.compat.mindspeed.api.triton.utils import get_available_device

from tests.common.tolerance import assert_close
from tests.python.compat.compat_common import bitwise, la_inputs, leaves


def _rnd(*shape, seed, dtype=torch.float32):
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _against(name, ours_fn, comp_fn, inputs, dtype, out_dtype=None):
    ins = leaves(*inputs)
    y = ours_fn(*ins)
    gy = _rnd(*y.shape, seed=77, dtype=y.dtype)
    wrt = [t for t in ins if t.is_floating_point()]
    g = torch.autograd.grad(y, wrt, gy)
    res = []
    for dt in (torch.float64, dtype):
        i2 = leaves(*[t.to(dt) if t.is_floating_point() else t for t in inputs])
        y2 = comp_fn(*i2)
        res.append((y2, torch.autograd.grad(y2, [t for t in i2 if t.is_floating_point()], gy.to(y2.dtype))))
    (r, gr), (b, gb) = res
    assert_close(y, b, r, out_dtype or dtype, f"{name} y")
    for i, (a, bb, rr) in enumerate(zip(g, gb, gr)):
        assert_close(a, bb, rr, dtype, f"{name} grad {i}")


def test_fused_cross_entropy_loss_function_quick_start_form():
    """FusedCrossEntropyLossFunction.apply(logits, loss_weight, labels): sum_i CE_i w_i, a real
    torch.autograd.Function with gradients for logits and loss_weight."""
    N, V = 24, 64
    logits, lw = _rnd(N, V, seed=1, dtype=torch.float16), _rnd(N, seed=2).abs()
    labels = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    labels[5] = -100

    def comp(x, w):
        return (F.cross_entropy(x.float() if x.dtype != torch.float64 else x, labels.long(),
                                reduction="none", ignore_index=-100) * w).sum()
    ins = leaves(logits, lw)
    loss = FusedCrossEntropyLossFunction.apply(ins[0], ins[1], labels)
    assert loss.dtype == torch.float32 and loss.shape == ()
    loss.backward()
    r = leaves(logits.double(), lw.double())
    comp(*r).backward()
    b = leaves(logits, lw)
    comp(*b).backward()
    assert_close(loss, comp(logits, lw), comp(logits.double(), lw.double()), torch.float16, "ms CE loss")
    assert_close(ins[0].grad, b[0].grad, r[0].grad, torch.float16, "ms CE dlogits")
    assert_close(ins[1].grad, b[1].grad, r[1].grad, torch.float32, "ms CE dloss_weight")
    # without a weight, and the optional ignore_index (the Ascend prototype's 4th argument)
    x = logits.float().requires_grad_()
    labels7 = torch.where(labels == -100, 7, labels)
    loss2 = FusedCrossEntropyLossFunction.apply(x, None, labels7, 7)
    torch.testing.assert_close(loss2, F.cross_entropy(x, labels7.long(), ignore_index=7, reduction="sum"))


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_npu_matmul_add(grad_dtype):
    """grad += grad_output^T @ total_input, in place: fp32 main_grad (npu_matmul_add_fp32) or a
    16-bit one (npu_matmul_add_fp16, MindSpeed's dispatch on main_grad's dtype)."""
    x, go = _rnd(2, 7, 12, seed=3, dtype=torch.bfloat16), _rnd(2, 7, 5, seed=4, dtype=torch.bfloat16)
    grad = _rnd(5, 12, seed=5).to(grad_dtype)
    before = grad.clone()
    fn = npu_matmul_add_fp32 if grad_dtype == torch.float32 else npu_matmul_add_fp16
    assert fn(x, go, grad) is None
    ref = before.double() + go.double().reshape(-1, 5).t() @ x.double().reshape(-1, 12)
    base = (before.float() + go.reshape(-1, 5).t().float() @ x.reshape(-1, 12).float()).to(grad_dtype)
    assert_close(grad, base, ref, grad_dtype, f"npu_matmul_add {grad_dtype}")
    empty = grad.clone()
    fn(x[:, :0], go[:, :0], empty)  # MindSpeed returns early on an empty dim
    assert torch.equal(empty, grad)


def test_rmsnorm_without_weight_and_l2norm():
    x = _rnd(2, 5, 48, seed=6)
    _against("rmsnorm_without_weight", lambda x: rmsnorm_without_weight(x, 1e-6),
             lambda x: torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), (x,), torch.float32)
    y, rstd = l2norm.l2norm_fwd(x, 1e-6)
    assert rstd.dtype == torch.float32 and rstd.shape == (2, 5)
    dy = _rnd(2, 5, 48, seed=7)
    assert bitwise(l2norm.l2norm_bwd(y, rstd, dy, 1e-6), fusedops.ops.l2norm.l2norm_bwd(y, rstd, dy))


def mhc_post_comp(x, residual, h_post, h_res):
    """MindSpeed-LLM MHCPostTriton: out[k] = h_post[k] x + sum_j h_res[j, k] residual[j]."""
    B, S, D = x.shape
    n = h_post.shape[-1]
    r = residual.reshape(B, S, n, D)
    out = h_post[..., :, None] * x[..., None, :] + torch.einsum("bsjk,bsjd->bskd", h_res, r)
    return out.reshape(B, S, n * D)


def test_mhc_autograd_functions_with_flattened_residual():
    B, S, n, C = 2, 3, 4, 16
    x, res = _rnd(B, S, C, seed=8), _rnd(B, S, n * C, seed=9)
    h_post, h_res = torch.rand(B, S, n, generator=torch.Generator().manual_seed(3)), _rnd(B, S, n, n, seed=10)
    _against("MHCPostTriton", mhc.MHCPostTriton.apply, mhc_post_comp, (x, res, h_post, h_res), torch.float32)
    pre, xs = torch.rand(B, S, n, generator=torch.Generator().manual_seed(4)), _rnd(B, S, n, C, seed=11)
    _against("MhcPreBmm", mhc.MhcPreBmm.apply, lambda p, x: torch.einsum("bsi,bsic->bsc", p, x), (pre, xs),
             torch.float32)
    mixes, scale, base = _rnd(B, S, (2 + n) * n, seed=12), torch.rand(3), _rnd((2 + n) * n, seed=13)
    ours = mhc.hc_split_sinkhorn(mixes, scale, base, n, 20, 1e-6)
    native = fusedops.hc_split_sinkhorn(mixes, scale, base, n, 20, 1e-6)
    assert all(bitwise(a, b) for a, b in zip(ours, native))
    assert bitwise(mhc.sinkhorn(ours[2], 5), fusedops.sinkhorn(ours[2], 5, 1e-6, "mindspeed"))


def test_causal_conv1d_wd_weight_and_eighth_position():
    """mindspeed_ops.api.triton.convolution.causal_conv1d: weight [W, D]; MindSpeed's 8th
    positional is cu_seqlens."""
    D, W = 16, 4
    x, w = _rnd(1, 21, D, seed=14), _rnd(W, D, seed=15)
    h = _rnd(2, D, W, seed=16)
    cu = torch.tensor([0, 9, 21], dtype=torch.int32)
    y, f = convolution.causal_conv1d(x, w, None, None, h, True, "silu", cu, chunk_size=64)
    yn, fn = fusedops.causal_conv1d(x, w, None, None, h, True, "silu", cu_seqlens=cu)
    assert bitwise(y, yn) and bitwise(f, fn)


def test_linear_attention_call_forms():
    """MindSpeed Ops' GDN test call: chunk_gated_delta_rule(**inputs, initial_state=...,
    output_final_state=..., chunk_size=64, head_first=False)."""
    q, k, v, g, beta, h0 = la_inputs(1, 70, 2, 2, 16, 16, torch.float32, 17)
    inputs = dict(q=q, k=k, v=v, g=g, beta=beta)
    o, ht = ms_gdn_module.chunk_gated_delta_rule(**inputs, initial_state=h0, output_final_state=True,
                                                 chunk_size=64, head_first=False)
    on, hn = fusedops.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert bitwise(o, on) and bitwise(ht, hn)
    with pytest.raises(NotImplementedError, match="head_first=True"):
        ms_gdn_module.chunk_gated_delta_rule(**inputs, head_first=True)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['cp_group'\]"):
        ms_gdn_module.chunk_gated_delta_rule(**inputs, cp_group=None)
    _, _, _, gk, _, _ = la_inputs(1, 70, 2, 2, 16, 16, torch.float32, 18, kda=True)
    o, ht = kda.chunk_kda(q, k, v, gk, beta, None, h0, True, cu_seqlens=torch.tensor([0, 70]))
    on, hn = fusedops.chunk_kda(q, k, v, gk, beta, initial_state=h0, output_final_state=True)
    assert bitwise(o, on) and bitwise(ht, hn)
    o, _ = kda.fused_recurrent_kda(q, k, v, gk, beta, initial_state=h0)
    assert bitwise(o, fusedops.fused_recurrent_kda(q, k, v, gk, beta, initial_state=h0)[0])


def test_torch_ops_mindspeed_ops_aliases():
    import fusedops.compat.mindspeed.ops as ms_ops

    for name in ms_ops.NAMES:
        assert hasattr(torch.ops.mindspeed_ops, name), name
    x = _rnd(4, 3, 10, seed=19).requires_grad_()
    y = torch.ops.mindspeed_ops.npu_clipped_swiglu(x, None, -1, 1.702, 7.0, 1.0, True)
    assert bitwise(y, fusedops.clipped_swiglu(x))
    y.sum().backward()
    x2 = x.detach().requires_grad_()
    fusedops.clipped_swiglu(x2).sum().backward()
    assert bitwise(x.grad, x2.grad)
    grad = torch.zeros(5, 12)
    torch.ops.mindspeed_ops.npu_matmul_add_fp32(_rnd(7, 12, seed=20), _rnd(7, 5, seed=21), grad)
    assert grad.abs().sum() > 0


def test_helpers():
    assert get_available_device() in ("cpu", "cuda")
    assert sort_chunks_by_idx.moe_sort_chunks_by_index is fusedops.moe_sort_chunks_by_index
    from fusedops.compat.mindspeed.utils import is_arch35

    assert is_arch35() is False
