"""fusedops.compat.install(name): unchanged code that imports fla, causal_conv1d or
mindspeed_ops runs on fusedops (checked in subprocesses, so no alias leaks into other tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=240)


def test_fla_imports_resolve_to_fusedops():
    r = run("""
        import fusedops.compat
        fusedops.compat.install("fla")
        import torch
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.common.chunk_o import chunk_fwd_o
        from fla.modules import FusedRMSNormGated, ShortConvolution
        from fla.modules.l2norm import l2norm
        import fla, fla.ops.kda
        import fusedops.compat.fla.ops.gated_delta_rule.chunk as ours
        assert chunk_gated_delta_rule is ours.chunk_gated_delta_rule
        assert fla.__version__ == "0.6.0" and fla.ops.kda.chunk_kda.__module__.startswith("fusedops")
        assert FusedRMSNormGated.__module__.startswith("fusedops.compat.fla")
        q = torch.randn(1, 9, 2, 8); v = torch.randn(1, 9, 2, 8)
        g = torch.nn.functional.logsigmoid(torch.randn(1, 9, 2)); beta = torch.rand(1, 9, 2)
        o, ht = chunk_gated_delta_rule(q, l2norm(q), v, g, beta, output_final_state=True)
        assert o.shape == (1, 9, 2, 8) and ht.shape == (1, 2, 8, 8)
        print("OK", chunk_fwd_o.__module__)
    """)
    assert r.returncode == 0, r.stderr
    assert "OK fusedops.compat.fla.ops.common.chunk_o" in r.stdout


def test_causal_conv1d_and_mindspeed_ops_resolve_to_fusedops():
    r = run("""
        import fusedops.compat
        fusedops.compat.install("causal_conv1d")
        fusedops.compat.install("mindspeed_ops")
        import torch
        from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
        from mindspeed_ops.api.triton.convolution import causal_conv1d
        from mindspeed_ops.api.atb.npu_matmul_add import npu_matmul_add_fp32
        from mindspeed_ops.utils import is_arch35
        import mindspeed_ops
        assert causal_conv1d_fn.__module__.startswith("fusedops.compat.causal_conv1d")
        assert causal_conv1d.__module__.startswith("fusedops.compat.mindspeed")
        assert not is_arch35() and hasattr(torch.ops.mindspeed_ops, "npu_matmul_add_fp32")
        print("OK", sorted(fusedops.compat.installed()))
    """)
    assert r.returncode == 0, r.stderr
    assert "OK ['causal_conv1d', 'mindspeed_ops']" in r.stdout


def test_unmirrored_names_fail_like_missing_modules_and_uninstall_restores():
    r = run("""
        import sys
        import fusedops.compat
        fusedops.compat.install("fla"); fusedops.compat.install("fla")  # idempotent
        try:
            import fla.layers
        except ModuleNotFoundError as e:
            print("MISSING", e.name)
        try:
            from fla.ops.common.chunk_o import chunk_bwd_dv
        except ImportError:
            print("NO NAME")
        fusedops.compat.uninstall("fla")
        assert not [k for k in sys.modules if k == "fla" or k.startswith("fla.")]
        try:
            import fla
            print("ORIGINAL", fla.__file__)  # an installed flash-linear-attention, not fusedops
        except ModuleNotFoundError:
            print("GONE")
    """)
    assert r.returncode == 0, r.stderr
    assert "MISSING fla.layers" in r.stdout and "NO NAME" in r.stdout
    assert "GONE" in r.stdout or ("ORIGINAL" in r.stdout and "fusedops" not in r.stdout)


def test_install_refuses_when_the_original_is_already_imported():
    r = run("""
        import sys, types
        sys.modules["fla"] = types.ModuleType("fla")   # stands for the real package
        import fusedops.compat
        try:
            fusedops.compat.install("fla")
        except RuntimeError as e:
            print("REFUSED", e)
    """)
    assert r.returncode == 0, r.stderr
    assert "REFUSED fusedops.compat.install('fla'): the original package 'fla' is already imported" in r.stdout


def test_unknown_package():
    import fusedops.compat

    with pytest.raises(ValueError, match="unknown package 'flash_attn'; known: causal_conv1d, fla, "
                                         "mindspeed_ops"):
        fusedops.compat.install("flash_attn")
