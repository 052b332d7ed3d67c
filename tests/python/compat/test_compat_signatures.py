"""Every mirrored name has the original's signature: positional order, keyword names, kinds and
defaults, checked with inspect.signature against signatures written here from the originals'
sources (flash-linear-attention 0.6.0 = fla-core 0.6.0 wheel; causal-conv1d 1.7.0 sdist,
causal_conv1d/causal_conv1d_interface.py; MindSpeed Ops where its callers and docs show the
form, see docs/compat.md). Neither original is imported: CI has neither.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

# "module:qualname": "(parameters)" exactly as the original declares them.
FLA = {
    # fla/ops/gated_delta_rule/chunk.py, fused_recurrent.py
    "ops.gated_delta_rule:chunk_gated_delta_rule":
        "(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, "
        "use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, "
        "state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None, "
        "cp_context=None, **kwargs)",
    "ops.gated_delta_rule:fused_recurrent_gated_delta_rule":
        "(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None, "
        "output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, "
        "A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, "
        "state_v_first=False, cu_seqlens=None, **kwargs)",
    # fla/ops/kda/chunk.py, fused_recurrent.py
    "ops.kda:chunk_kda":
        "(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, "
        "use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, "
        "allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False, "
        "return_intermediate_states=False, state_v_first=False, cu_seqlens=None, "
        "cu_seqlens_cpu=None, cp_context=None, use_graph=False, max_num_seqs=None, **kwargs)",
    "ops.kda:fused_recurrent_kda":
        "(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None, "
        "output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, "
        "use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, "
        "state_v_first=False, cu_seqlens=None, **kwargs)",
    # fla/ops/common/chunk_delta_h.py
    "ops.common.chunk_delta_h:chunk_gated_delta_rule_fwd_h":
        "(k, w, u, g=None, gk=None, initial_state=None, output_final_state=False, chunk_size=64, "
        "save_new_value=True, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, "
        "chunk_indices=None, chunk_offsets=None)",
    "ops.common.chunk_delta_h:chunk_gated_delta_rule_bwd_dhu":
        "(q, k, w, do, dv, g=None, gk=None, h0=None, dht=None, scale=None, state_v_first=False, "
        "cu_seqlens=None, chunk_size=64, chunk_indices=None, chunk_offsets=None, use_graph=False)",
    # fla/ops/common/chunk_o.py
    "ops.common.chunk_o:chunk_fwd_o":
        "(q, k, v, h, g=None, g_gamma=None, scale=None, state_v_first=False, cu_seqlens=None, "
        "chunk_size=64, chunk_indices=None)",
    "ops.common.chunk_o:chunk_bwd_dv_local":
        "(q, k, do, g=None, g_gamma=None, A=None, scale=None, cu_seqlens=None, chunk_size=64, "
        "chunk_indices=None)",
    "ops.common.chunk_o:chunk_bwd_dqkwg":
        "(q, k, v, do, h, dh, w=None, g=None, g_gamma=None, dv=None, scale=None, "
        "state_v_first=False, cu_seqlens=None, chunk_size=64, chunk_indices=None)",
    # fla/ops/common/chunk_scaled_dot_kkt.py
    "ops.common.chunk_scaled_dot_kkt:chunk_scaled_dot_kkt_fwd":
        "(k, g=None, beta=None, cu_seqlens=None, chunk_size=64, output_dtype=torch.float32, "
        "chunk_indices=None)",
    # fla/ops/gated_delta_rule/wy_fast.py, gate.py, chunk_fwd.py
    "ops.gated_delta_rule.wy_fast:recompute_w_u_fwd":
        "(k, v, beta, A, g=None, cu_seqlens=None, chunk_indices=None)",
    "ops.gated_delta_rule.wy_fast:prepare_wy_repr_bwd":
        "(k, v, beta, A, dw, du, g=None, cu_seqlens=None, chunk_indices=None)",
    "ops.gated_delta_rule.gate:fused_gdn_gate": "(g, A_log, dt_bias=None, output_dtype=torch.float32)",
    "ops.gated_delta_rule.gate:gdn_gate_fwd": "(g, A_log, dt_bias=None, output_dtype=torch.float32)",
    "ops.gated_delta_rule.gate:gdn_gate_bwd": "(g, A_log, dt_bias, dyg)",
    "ops.gated_delta_rule.gate:gdn_gate_chunk_cumsum":
        "(g, A_log, chunk_size, scale=None, dt_bias=None, cu_seqlens=None, chunk_indices=None, "
        "output_dtype=torch.float)",
    "ops.gated_delta_rule.chunk_fwd:chunk_gated_delta_rule_fwd_intra":
        "(k, v, g=None, beta=None, cu_seqlens=None, chunk_size=64, chunk_indices=None)",
    # fla/ops/utils/cumsum.py, solve_tril.py, index.py, sinkhorn/ops.py
    "ops.utils:chunk_local_cumsum":
        "(g, chunk_size, reverse=False, scale=None, cu_seqlens=None, output_dtype=torch.float, "
        "chunk_indices=None, use_graph=False, **kwargs)",
    "ops.utils.cumsum:chunk_local_cumsum_scalar":
        "(g, chunk_size, reverse=False, scale=None, cu_seqlens=None, output_dtype=torch.float, "
        "chunk_indices=None, use_graph=False, **kwargs)",
    "ops.utils.cumsum:chunk_local_cumsum_vector":
        "(g, chunk_size, reverse=False, scale=None, cu_seqlens=None, output_dtype=torch.float, "
        "chunk_indices=None, use_graph=False, **kwargs)",
    "ops.utils:solve_tril": "(A, cu_seqlens=None, chunk_indices=None, output_dtype=torch.float)",
    "ops.utils:prepare_chunk_indices": "(cu_seqlens, chunk_size, cu_seqlens_cpu=None)",
    "ops.utils:prepare_chunk_offsets": "(cu_seqlens, chunk_size)",
    "ops.utils:sinkhorn": "(logits, num_iters=20)",
    # fla/ops/kda/chunk_intra.py, chunk_bwd.py, wy_fast.py, gate.py
    "ops.kda.chunk_intra:chunk_kda_fwd_intra":
        "(q, k, v, gk=None, beta=None, scale=None, cu_seqlens=None, chunk_size=64, "
        "chunk_indices=None, safe_gate=False, lower_bound=None, disable_recompute=False, "
        "use_graph=False)",
    "ops.kda.chunk_intra:chunk_kda_bwd_intra":
        "(q, k, g, beta, dAqk, dAkk, dq, dk, db, dg, cu_seqlens=None, chunk_indices=None, "
        "chunk_size=64, safe_gate=False, lower_bound=None, use_graph=False)",
    "ops.kda.chunk_bwd:chunk_kda_bwd_dAv":
        "(q, k, v, do, A=None, scale=None, cu_seqlens=None, chunk_size=64, chunk_indices=None, "
        "use_graph=False)",
    "ops.kda.chunk_bwd:chunk_kda_bwd_wy_dqkg_fused":
        "(q, k, v, v_new, g, beta, A, h, do, dh, dv, scale=None, state_v_first=False, "
        "cu_seqlens=None, chunk_size=64, chunk_indices=None, chunk_offsets=None, use_graph=False)",
    "ops.kda.wy_fast:recompute_w_u_fwd":
        "(k, v, beta, A, gk, q=None, cu_seqlens=None, chunk_indices=None, use_graph=False)",
    "ops.kda.gate:fused_kda_gate":
        "(g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=torch.float32)",
    "ops.kda.gate:kda_gate_fwd":
        "(g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=torch.float32)",
    "ops.kda.gate:kda_gate_bwd": "(g, A_log=None, dt_bias=None, dyg=None, lower_bound=None)",
    "ops.kda.gate:kda_gate_chunk_cumsum":
        "(g, A_log, chunk_size, scale=None, dt_bias=None, cu_seqlens=None, "
        "output_dtype=torch.float, chunk_indices=None, lower_bound=None, use_graph=False, **kwargs)",
    # fla/modules/causal_conv1d/ops.py
    "modules.causal_conv1d:causal_conv1d":
        "(x, weight=None, bias=None, residual=None, initial_state=None, output_final_state=False, "
        "activation=None, backend='triton', cu_seqlens=None, cu_seqlens_cpu=None, "
        "chunk_indices=None, cp_context=None, **kwargs)",
    "modules.causal_conv1d:causal_conv1d_update":
        "(x, cache, residual=None, weight=None, bias=None, activation=None)",
    "modules:ShortConvolution.__init__":
        "(self, hidden_size, kernel_size, bias=False, activation='silu', backend='triton', "
        "device=None, dtype=None, **kwargs)",
    "modules:ShortConvolution.forward":
        "(self, x, residual=None, mask=None, cache=None, output_final_state=False, "
        "cu_seqlens=None, chunk_indices=None, **kwargs)",
    "modules:ShortConvolution.step":
        "(self, x, residual, cache, output_final_state=False, cu_seqlens=None)",
    # fla/modules/norm/fused_norm_gate.py, layernorm_gated.py, l2norm.py
    "modules.fused_norm_gate:rms_norm_gated":
        "(x, g, weight, bias, activation='swish', residual=None, prenorm=False, "
        "residual_in_fp32=False, eps=1e-06)",
    "modules:FusedRMSNormGated.__init__":
        "(self, hidden_size, elementwise_affine=True, eps=1e-05, activation='swish', device=None, "
        "dtype=None)",
    "modules:FusedRMSNormGated.forward":
        "(self, x, g, residual=None, prenorm=False, residual_in_fp32=False)",
    "modules:FusedRMSNormSwishGate.__init__":
        "(self, hidden_size, elementwise_affine=True, eps=1e-05, device=None, dtype=None)",
    "modules.layernorm_gated:rmsnorm_fn":
        "(x, weight, bias, z=None, eps=1e-06, group_size=None, norm_before_gate=True)",
    "modules.norm:RMSNormGated.__init__":
        "(self, hidden_size, eps=1e-05, group_size=None, norm_before_gate=False, device=None, "
        "dtype=None)",
    "modules.norm:RMSNormGated.forward": "(self, x, z=None)",
    "modules.l2norm:l2norm": "(x, eps=1e-06, output_dtype=None)",
    "modules.l2norm:l2norm_fwd": "(x, eps=1e-06, output_dtype=None)",
    "modules.l2norm:l2norm_bwd": "(y, rstd, dy, eps=1e-06)",
    "modules:L2Norm.__init__": "(self, eps=1e-06, output_dtype=None)",
    "modules:L2Norm.forward": "(self, x)",
    # fla/modules/fused_cross_entropy/ops.py, fused_linear_cross_entropy/ops.py
    "modules.fused_cross_entropy:cross_entropy_loss":
        "(logits, target, label_smoothing=0.0, logit_scale=1.0, lse_square_scale=0.0, "
        "logit_softcapping=None, ignore_index=-100, inplace_backward=False, process_group=None)",
    "modules:FusedCrossEntropyLoss.__init__":
        "(self, ignore_index=-100, reduction='mean', label_smoothing=0.0, logit_scale=1.0, "
        "lse_square_scale=0.0, logit_softcapping=None, inplace_backward=False, process_group=None, "
        "return_z_loss=False)",
    "modules:FusedCrossEntropyLoss.forward": "(self, input, target)",
    "modules.fused_linear_cross_entropy:fused_linear_cross_entropy_loss":
        "(x, target, weight, bias=None, ignore_index=-100, label_smoothing=0.0, logit_scale=1.0, "
        "logit_softcapping=None, num_chunks=8, reduction='mean', use_l2warp=False, "
        "l2_penalty_factor=0.0001, accumulate_grad_in_fp32=True, process_group=None)",
    "modules:FusedLinearCrossEntropyLoss.__init__":
        "(self, ignore_index=-100, label_smoothing=0.0, logit_scale=1.0, logit_softcapping=None, "
        "num_chunks=8, reduction='mean', use_l2warp=False, l2_penalty_factor=0.0001, "
        "accumulate_grad_in_fp32=True, process_group=None)",
    "modules:FusedLinearCrossEntropyLoss.forward": "(self, x, target, weight, bias=None)",
}

# causal-conv1d 1.7.0, causal_conv1d/causal_conv1d_interface.py
CAUSAL_CONV1D = {
    ":causal_conv1d_fn":
        "(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False, "
        "final_states_out=None, activation=None)",
    ":causal_conv1d_update":
        "(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, "
        "conv_state_indices=None)",
}

# MindSpeed Ops: forms seen in its callers and docs ([C] in docs/compat.md) and, where not seen,
# the first eight FLA positions with the rest keyword-only ([I]).
MINDSPEED = {
    "api.triton.convolution:causal_conv1d":
        "(x, weight, bias=None, residual=None, initial_state=None, output_final_state=False, "
        "activation=None, cu_seqlens=None, **kwargs)",
    "api.atb.npu_matmul_add:npu_matmul_add_fp32": "(total_input, grad_output, grad)",
    "api.atb.npu_matmul_add:npu_matmul_add_fp16": "(total_input, grad_output, grad)",
    "api.triton.l2norm:l2norm_fwd": "(x, eps=1e-06, output_dtype=None)",
    "api.triton.l2norm:l2norm_bwd": "(y, rstd, dy, eps=1e-06)",
    "api.triton.fused_cross_entropy_loss:FusedCrossEntropyLossFunction.forward":
        "(ctx, logits, loss_weight, labels, ignore_index=-100)",
    "api.triton.rmsnorm_without_weight:rmsnorm_without_weight": "(x, norm_eps=1e-06)",
    "api.triton.mhc:hc_split_sinkhorn":
        "(mixes, hc_scale, hc_base, hc_mult=4, sinkhorn_iters=20, eps=1e-06)",
    "api.triton.mhc:mhc_pre_bmm": "(pre, x_unflatten)",
    "api.triton.mhc:mhc_post": "(x, residual, h_post, h_res)",
    "api.triton.chunk_gated_delta_rule:chunk_gated_delta_rule":
        "(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *, "
        "head_first=False, **kwargs)",
    "api.triton.kda:chunk_kda":
        "(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *, "
        "head_first=False, **kwargs)",
}


def _expected(sig: str) -> inspect.Signature:
    scope = {"torch": torch}
    exec(f"def _f{sig}: pass", scope)  # noqa: S102 - a signature literal written above
    return inspect.signature(scope["_f"])


def _actual(package: str, key: str) -> inspect.Signature:
    module, qualname = key.split(":")
    obj = importlib.import_module(package + ("." + module if module else ""))
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return inspect.signature(obj)


def _as_rows(sig: inspect.Signature):
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


CASES = ([("fusedops.compat.fla", k, v) for k, v in FLA.items()]
         + [("fusedops.compat.causal_conv1d", k, v) for k, v in CAUSAL_CONV1D.items()]
         + [("fusedops.compat.mindspeed", k, v) for k, v in MINDSPEED.items()])


@pytest.mark.parametrize("package,key,sig", CASES, ids=[f"{p.split('.')[-1]}:{k}" for p, k, _ in CASES])
def test_signature_is_the_originals(package, key, sig):
    assert _as_rows(_actual(package, key)) == _as_rows(_expected(sig))


# Native functions whose names are FLA's: FLA's positional order and keyword names as a prefix,
# every fusedops extra keyword-only (item 2 of the compat issue).
NATIVE = {
    "fusedops:causal_conv1d":
        "(x, weight, bias=None, residual=None, initial_state=None, output_final_state=False, "
        "activation=None)",
    "fusedops:rms_norm_gated":
        "(x, g=None, weight=None, bias=None, activation='swish', residual=None, prenorm=False, "
        "residual_in_fp32=False, eps=1e-06)",
    "fusedops.nn:RMSNormGated.__init__":
        "(self, hidden_size, eps=1e-05, group_size=None, norm_before_gate=False, device=None, "
        "dtype=None)",
    "fusedops.nn:FusedRMSNormGated.__init__":
        "(self, hidden_size, elementwise_affine=True, eps=1e-05, activation='swish', device=None, "
        "dtype=None)",
    "fusedops.nn:FusedCrossEntropyLoss.__init__":
        "(self, ignore_index=-100, reduction=None, label_smoothing=0.0, logit_scale=1.0, "
        "lse_square_scale=0.0, logit_softcapping=None, inplace_backward=False)",
}


@pytest.mark.parametrize("key,sig", list(NATIVE.items()), ids=list(NATIVE))
def test_native_positional_order_is_flas(key, sig):
    module, name = key.split(":")
    actual = _as_rows(_actual(module, ":" + name))
    prefix = _as_rows(_expected(sig))
    assert actual[:len(prefix)] == prefix
    extra = [(n, k) for n, k, _ in actual[len(prefix):]]
    assert all(k in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD) for _, k in extra), extra


# Native linear-attention functions whose names are FLA's: FLA 0.6.0's parameters (FLA's own
# entries above) in its positional order with its names and defaults, then fusedops' extras, all
# keyword-only: "native key": (FLA key, the keyword-only extras, in order).
NATIVE_LA = {
    "fusedops:chunk_gated_delta_rule": ("ops.gated_delta_rule:chunk_gated_delta_rule", (
        "chunk_size", "use_gate_in_kernel", "A_log", "dt_bias", "keep_intermediates", "cp",
        "transpose_state_layout")),
    "fusedops:fused_recurrent_gated_delta_rule": (
        "ops.gated_delta_rule:fused_recurrent_gated_delta_rule", ("transpose_state_layout",)),
    "fusedops:chunk_kda": ("ops.kda:chunk_kda", (
        "chunk_size", "A_log", "dt_bias", "cp", "transpose_state_layout")),
    "fusedops:fused_recurrent_kda": ("ops.kda:fused_recurrent_kda", ("transpose_state_layout",)),
    "fusedops.ops.gated_delta_rule:chunk_local_cumsum": ("ops.utils:chunk_local_cumsum", ()),
    "fusedops.ops.kda:chunk_local_cumsum": ("ops.utils:chunk_local_cumsum", ()),
    "fusedops.ops.gated_delta_rule:solve_tril": ("ops.utils:solve_tril", ()),
    "fusedops.ops.gated_delta_rule:prepare_chunk_indices": ("ops.utils:prepare_chunk_indices", ()),
    "fusedops.ops.gated_delta_rule:chunk_gated_delta_rule_fwd_h": (
        "ops.common.chunk_delta_h:chunk_gated_delta_rule_fwd_h", ()),
    "fusedops.ops.gated_delta_rule:chunk_gated_delta_rule_bwd_dhu": (
        "ops.common.chunk_delta_h:chunk_gated_delta_rule_bwd_dhu", ()),
    "fusedops.ops.kda:chunk_kda_fwd_h": ("ops.common.chunk_delta_h:chunk_gated_delta_rule_fwd_h", ()),
    "fusedops.ops.kda:chunk_kda_bwd_dhu": ("ops.common.chunk_delta_h:chunk_gated_delta_rule_bwd_dhu", ()),
    "fusedops.ops.gated_delta_rule:chunk_fwd_o": ("ops.common.chunk_o:chunk_fwd_o", ()),
    "fusedops.ops.gated_delta_rule:chunk_bwd_dv_local": ("ops.common.chunk_o:chunk_bwd_dv_local", ()),
    "fusedops.ops.gated_delta_rule:chunk_bwd_dqkwg": ("ops.common.chunk_o:chunk_bwd_dqkwg", ()),
    "fusedops.ops.gated_delta_rule:chunk_scaled_dot_kkt_fwd": (
        "ops.common.chunk_scaled_dot_kkt:chunk_scaled_dot_kkt_fwd", ()),
    "fusedops.ops.gated_delta_rule:recompute_w_u_fwd": ("ops.gated_delta_rule.wy_fast:recompute_w_u_fwd", ()),
    "fusedops.ops.gated_delta_rule:prepare_wy_repr_bwd": ("ops.gated_delta_rule.wy_fast:prepare_wy_repr_bwd", ()),
    "fusedops.ops.gated_delta_rule:fused_gdn_gate": ("ops.gated_delta_rule.gate:fused_gdn_gate", ()),
    "fusedops.ops.gated_delta_rule:gdn_gate_fwd": ("ops.gated_delta_rule.gate:gdn_gate_fwd", ()),
    "fusedops.ops.gated_delta_rule:gdn_gate_bwd": ("ops.gated_delta_rule.gate:gdn_gate_bwd", ()),
    "fusedops.ops.kda:chunk_kda_fwd_intra": ("ops.kda.chunk_intra:chunk_kda_fwd_intra", ()),
    "fusedops.ops.kda:chunk_kda_bwd_intra": ("ops.kda.chunk_intra:chunk_kda_bwd_intra", ()),
    "fusedops.ops.kda:chunk_kda_bwd_dAv": ("ops.kda.chunk_bwd:chunk_kda_bwd_dAv", ()),
    "fusedops.ops.kda:chunk_kda_bwd_wy_dqkg_fused": ("ops.kda.chunk_bwd:chunk_kda_bwd_wy_dqkg_fused", ()),
    "fusedops.ops.kda:fused_kda_gate": ("ops.kda.gate:fused_kda_gate", ()),
    "fusedops.ops.kda:kda_gate_fwd": ("ops.kda.gate:kda_gate_fwd", ()),
    "fusedops.ops.kda:kda_gate_bwd": ("ops.kda.gate:kda_gate_bwd", ()),
}


@pytest.mark.parametrize("key", list(NATIVE_LA), ids=list(NATIVE_LA))
def test_native_linear_attention_signature_is_flas(key):
    fla_key, extras = NATIVE_LA[key]
    module, name = key.split(":")
    actual = _as_rows(_actual(module, ":" + name))
    fla = _as_rows(_expected(FLA[fla_key]))
    var_kw = [r for r in fla if r[1] == inspect.Parameter.VAR_KEYWORD]
    fla = [r for r in fla if r[1] != inspect.Parameter.VAR_KEYWORD]
    assert actual[:len(fla)] == fla
    rest = actual[len(fla):]
    assert [n for n, k, _ in rest if k == inspect.Parameter.KEYWORD_ONLY] == list(extras)
    # FLA's **kwargs stay (fusedops rejects unknown keywords in them; head_first raises as in FLA)
    assert [k for _, k, _ in rest if k != inspect.Parameter.KEYWORD_ONLY] == [k for _, k, _ in var_kw]


def test_native_exports_are_the_ops_functions():
    import fusedops
    from fusedops.ops import gated_delta_rule as gdn
    from fusedops.ops import kda

    assert fusedops.chunk_gated_delta_rule is gdn.chunk_gated_delta_rule
    assert fusedops.fused_recurrent_gated_delta_rule is gdn.fused_recurrent_gated_delta_rule
    assert fusedops.chunk_kda is kda.chunk_kda and fusedops.fused_recurrent_kda is kda.fused_recurrent_kda
    assert fusedops.gated_delta_rule is gdn and fusedops.kda is kda


def test_mindspeed_functions_are_autograd_functions():
    from fusedops.compat.mindspeed.api.triton.fused_cross_entropy_loss import FusedCrossEntropyLossFunction
    from fusedops.compat.mindspeed.api.triton.mhc import MHCPostTriton, MhcPreBmm

    for cls in (FusedCrossEntropyLossFunction, MhcPreBmm, MHCPostTriton):
        assert issubclass(cls, torch.autograd.Function), cls
